//! toolwall-relay: an agent's MCP stdio server that forwards to the toolwall gateway.

mod relay;

use std::process::ExitCode;

use relay::options::{self, Command, USAGE};

/// Exit status for a bad command line.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    match options::parse(std::env::args_os().skip(1)) {
        Ok(Command::Run(options)) => relay::run(options),
        Ok(Command::Help) => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Ok(Command::Version) => {
            println!("toolwall-relay {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("toolwall-relay: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}
