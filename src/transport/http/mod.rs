//! The Streamable HTTP door, sans-IO: request reading, the endpoint's decisions for both
//! MCP eras, responses, sessions, metrics text and TLS. The mio loop moves bytes and
//! timers; everything here is tested without sockets. User-facing notes: `README.md` here.

pub mod auth;
pub mod authority;
pub mod config;
pub mod endpoint;
pub mod era;
pub mod http_date;
pub mod metrics;
pub mod reply;
pub mod request;
pub mod response;
pub mod sessions;
pub mod sse_writer;
pub mod tls;

pub use auth::HttpAuth;
pub use config::HttpConfig;
pub use endpoint::{Call, Decision, DoorSettings, Endpoint, Era, HeadDecision, HealthReport};
pub use request::{ParseError, Progress, Request, RequestLimits, RequestReader};
pub use response::HttpResponse;
pub use tls::{TlsSession, load_server_config};
