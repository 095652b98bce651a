//! Diagnostics: one line each on stderr, never a payload's contents.

use std::fmt;
use std::io::Write;

fn write(level: &str, args: fmt::Arguments<'_>) {
    let text = args.to_string().replace('\n', "\\n");
    // A failed diagnostic must never stop the relay.
    let _ = writeln!(std::io::stderr().lock(), "toolwall-relay: {level}: {text}");
}

pub fn warn(args: fmt::Arguments<'_>) {
    write("warn", args);
}

pub fn info(args: fmt::Arguments<'_>) {
    write("info", args);
}
