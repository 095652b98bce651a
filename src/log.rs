//! One line per event on stderr, with a level. Under systemd (`JOURNAL_STREAM` set) the
//! journal stamps the time, so we print none of our own.

use std::io::Write;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

static UNDER_JOURNAL: OnceLock<bool> = OnceLock::new();

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

/// Write one log line. Never include a secret in `args`.
pub fn write(level: Level, args: std::fmt::Arguments<'_>) {
    if level == Level::Debug && std::env::var_os("TOOLWALL_DEBUG").is_none() {
        return;
    }
    let journal = *UNDER_JOURNAL.get_or_init(|| std::env::var_os("JOURNAL_STREAM").is_some());
    let mut line = String::with_capacity(128);
    if !journal {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        line.push_str(&format!("{}.{:03} ", now.as_secs(), now.subsec_millis()));
    }
    line.push_str(level.as_str());
    line.push_str(": ");
    line.push_str(&args.to_string().replace('\n', "\\n"));
    line.push('\n');
    // A failed log write must never take the daemon down.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

#[macro_export]
macro_rules! error { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Error, format_args!($($t)*)) } }
#[macro_export]
macro_rules! warn { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Warn, format_args!($($t)*)) } }
#[macro_export]
macro_rules! info { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($t)*)) } }
#[macro_export]
macro_rules! debug { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Debug, format_args!($($t)*)) } }
