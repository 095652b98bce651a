//! The thread that reads one connection's frames and writes their payloads to stdout.

use std::io::{self, Read};
use std::sync::Arc;
use std::thread;

use toolwall_relay::frame::{Decoded, Decoder, MAX_TOTAL, PREFIX_LEN};

use super::diag;
use super::jsonrpc_error::INTERNAL_ERROR;
use super::session::Session;
use super::transport::Stream;

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 16 * 1024;
/// Buffer capacity kept between frames; a larger one (left by a big frame) is released.
const KEPT_CAPACITY: usize = 64 * 1024;
/// The reader only moves bytes; it needs little stack.
const STACK_SIZE: usize = 128 * 1024;

pub fn spawn(
    session: Arc<Session>,
    generation: u64,
    stream: Stream,
    target: String,
) -> io::Result<()> {
    thread::Builder::new()
        .name("socket-reader".into())
        .stack_size(STACK_SIZE)
        .spawn(move || read_frames(&session, generation, stream, &target))
        .map(drop)
}

fn read_frames(session: &Session, generation: u64, mut stream: Stream, target: &str) {
    let mut decoder = Decoder::new();
    let mut buf: Vec<u8> = Vec::new();
    let why = loop {
        let mut start = 0;
        let fatal = loop {
            match decoder.decode(&buf[start..]) {
                Ok(Decoded::NeedMore) => break None,
                // A gateway may name itself; the relay has no use for it.
                Ok(Decoded::Meta { consumed, .. }) => start += consumed,
                Ok(Decoded::Frame {
                    header,
                    payload,
                    consumed,
                    ..
                }) => {
                    start += consumed;
                    let sid = header.stream_id;
                    let fault = if payload.is_empty() {
                        Some("an empty payload")
                    } else if payload.contains(&b'\n') {
                        Some("a payload spanning lines")
                    } else if header.is_notification() != (sid == 0) {
                        Some("a stream id that does not match its notification flag")
                    } else {
                        None
                    };
                    match fault {
                        Some(fault) => reject(session, generation, sid, fault),
                        None if sid == 0 => session.deliver_notification(generation, payload),
                        None => session.deliver_reply(generation, sid, payload),
                    }
                }
                Ok(Decoded::Invalid {
                    stream_id,
                    fault,
                    consumed,
                }) => {
                    start += consumed;
                    reject(session, generation, stream_id, &fault.to_string());
                }
                Err(fatal) => break Some(format!("unframeable stream: {fatal}")),
            }
        };
        if let Some(why) = fatal {
            break why;
        }
        buf.drain(..start);
        if buf.capacity() > KEPT_CAPACITY && buf.len() < KEPT_CAPACITY {
            buf.shrink_to(KEPT_CAPACITY);
        }
        // The decoder refuses any frame over MAX_TOTAL, so what is left is below it.
        debug_assert!(buf.len() < PREFIX_LEN + MAX_TOTAL);
        let filled = buf.len();
        buf.resize(filled + READ_CHUNK, 0);
        match stream.read(&mut buf[filled..]) {
            Ok(0) => break "closed by the gateway".to_owned(),
            Ok(n) => buf.truncate(filled + n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => buf.truncate(filled),
            Err(e) => break format!("read failed: {e}"),
        }
    };
    stream.shutdown();
    if session.close_connection(generation) {
        diag::warn(format_args!("connection to {target} lost: {why}"));
    }
}

/// A frame that breaks the contract: its request, if any, is answered locally.
fn reject(session: &Session, generation: u64, stream_id: u32, fault: &str) {
    diag::warn(format_args!(
        "dropped a frame on stream {stream_id} from the gateway: {fault}"
    ));
    if stream_id != 0 {
        let message = format!("the gateway's reply broke the frame contract: {fault}");
        session.fail_stream(generation, stream_id, INTERNAL_ERROR, &message);
    }
}
