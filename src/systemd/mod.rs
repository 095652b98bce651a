//! Life under systemd without libsystemd: readiness and status notifications, the watchdog,
//! and sockets passed by socket activation.
//!
//! How `toolwall serve` uses it, in this order:
//!
//! 1. **First thing, before anything opens a file or starts a thread:**
//!    [`listen_fds()`] takes ownership of the sockets systemd passed at fd 3 and up (marking
//!    them close-on-exec so no worker inherits them) and [`Notifier::from_env()`] reads
//!    `NOTIFY_SOCKET`; both remove their variables from the environment, which is only
//!    safe while the process has one thread. [`watchdog_interval()`] may come any time.
//! 2. After the config is loaded: [`match_listeners()`] decides which configured door uses
//!    which inherited socket and which doors must still be bound; every
//!    [`ListenerPlan::explanations`] line is logged as a warning, and the unused sockets are
//!    dropped.
//! 3. `READY=1` once the listeners are up, the ledger is open and every worker attested;
//!    `WATCHDOG=1` from the event loop every [`watchdog_interval()`] (half of what systemd
//!    asks, see [`WatchdogTimer`]); `RELOADING=1` then `READY=1` around a SIGHUP reload;
//!    `STOPPING=1` at SIGTERM; `STATUS=` lines ([`status_line`]) whenever the summary changes.
//!
//! Nothing here blocks: notifications are single non-blocking datagrams, and a full or
//! missing notify socket is an error the caller logs, never a wait.

mod env;
mod listen_fds;
mod listener_match;
mod notify;
mod status;
#[cfg(test)]
mod test_child;
mod watchdog;

pub use listen_fds::{
    InheritedSocket, LISTEN_FDS_START, ListenEnv, MAX_FD_NAME_BYTES, MAX_LISTEN_FDS, SocketKind,
    listen_fds,
};
pub use listener_match::{
    DOOR_HTTP, DOOR_UNIX, DOOR_VSOCK, Door, ListenerPlan, ListenerSpec, match_listeners,
    wanted_listeners,
};
pub use notify::{MAX_NOTIFY_BYTES, Notifier, monotonic_usec};
pub use status::{MAX_STATUS_BYTES, StatusFacts, status_line};
pub use watchdog::{WatchdogTimer, parse_watchdog, watchdog_interval};
