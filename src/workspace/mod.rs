//! Confined workspaces: shell and file tools for agents, served as the `ws` server
//! (`ws__shell_run`, `ws__file_read`, ...). See `README.md` here for operators.
//!
//! - The gateway side is pure: [`config`] (the `[workspaces.NAME]` tables),
//!   [`ownership`] (who sees which workspace, `workers_list`), [`routing`] (where a call
//!   goes, the settings of each worker).
//! - The worker side: [`worker`] (`toolwall worker workspace`, one per workspace), its
//!   [`tasks`] table (sans-IO), [`launch`] (a leader process per task), the file tools
//!   ([`files`], [`find`]) behind [`paths`] (path safety), [`edit`], [`system_info`].
//! - Confinement is the sandbox's workspace role: `sandbox-profiles/workspace.*`.

pub mod args;
pub mod config;
pub mod edit;
pub mod error;
pub mod files;
pub mod find;
pub mod hosting;
pub mod id;
pub mod launch;
pub mod output;
pub mod ownership;
pub mod paths;
pub mod routing;
pub mod settings;
pub mod system_info;
pub mod task_cgroup;
pub mod tasks;
pub mod tools;
pub mod worker;

pub use config::{Network, WorkspaceConfig, WorkspacesConfig};
pub use error::{WsError, WsErrorCode};
pub use ownership::{WorkerState, WorkspaceDirectory};
pub use routing::{WsRoute, normalize_arguments, route_call, worker_settings};
pub use settings::WorkspaceWorkerSettings;
