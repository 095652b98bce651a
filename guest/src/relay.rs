//! The relay: MCP JSON-RPC lines on stdin/stdout to frames on one gateway connection.
//! Two blocking threads: this one reads stdin and writes frames, a socket reader writes
//! replies to stdout; they share only the pending-request table.

mod diag;
mod id_probe;
mod inbound;
mod jsonrpc_error;
mod line_reader;
mod link;
pub mod options;
mod process_name;
mod session;
mod socket_reader;
mod stdout_line;
mod transport;

use std::io;
use std::process::ExitCode;
use std::sync::Arc;

use toolwall_relay::frame::{HEADER_LEN, MAX_TOTAL};

use inbound::Inbound;
use jsonrpc_error::{TRANSPORT_ERROR, error_line};
use line_reader::{Line, LineReader};
use link::Link;
use options::Options;
use session::{Pending, Session};

/// Run until stdin ends and pending replies are in (or the drain timeout passes).
pub fn run(options: Options) -> ExitCode {
    let name = match &options.name {
        Some(name) => process_name::sanitise(name),
        None => process_name::parent_name(),
    };
    // The longest line that still fits one frame with this name.
    let payload_limit = MAX_TOTAL - HEADER_LEN - name.len();
    let session = Arc::new(Session::new(options.max_pending));
    let mut link = Link::new(options.target.clone(), name, Arc::clone(&session));
    link.connect_early();

    let mut status = ExitCode::SUCCESS;
    let mut lines = LineReader::new(io::stdin().lock(), payload_limit);
    loop {
        match lines.next_line() {
            Ok(Line::Eof) => break,
            Ok(Line::Oversized { bytes, id }) => {
                let why = format!(
                    "message of {bytes} bytes exceeds the frame payload limit of {payload_limit} bytes; not sent"
                );
                diag::warn(format_args!("{why}"));
                stdout_line::write(error_line(id.as_deref(), TRANSPORT_ERROR, &why).as_bytes());
            }
            Ok(Line::Complete(line)) => {
                let payload = line.trim_ascii_end();
                match inbound::classify(payload) {
                    Inbound::Blank => {}
                    Inbound::Request { id, method } => {
                        link.send_request(payload, Pending { id, method });
                    }
                    Inbound::Notification => link.send_notification(payload),
                    Inbound::Refused(reply) => stdout_line::write(reply.as_bytes()),
                    Inbound::Response => link.send_notification(payload),
                }
            }
            Err(e) => {
                diag::warn(format_args!("reading stdin: {e}"));
                status = ExitCode::FAILURE;
                break;
            }
        }
    }

    let unanswered = session.drain(options.drain_timeout);
    for request in &unanswered {
        let why = format!(
            "relay exiting: no {} response within {} s of end of input",
            request.method,
            options.drain_timeout.as_secs()
        );
        stdout_line::write(error_line(Some(&request.id), TRANSPORT_ERROR, &why).as_bytes());
    }
    if !unanswered.is_empty() {
        diag::warn(format_args!(
            "{} request(s) unanswered at exit",
            unanswered.len()
        ));
    }
    status
}
