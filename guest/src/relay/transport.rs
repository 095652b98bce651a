//! One blocking stream to the gateway, over vsock or a unix socket.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;

use vsock::VsockStream;

use super::options::Target;

pub enum Stream {
    Unix(UnixStream),
    Vsock(VsockStream),
}

impl Stream {
    pub fn connect(target: &Target) -> io::Result<Stream> {
        match target {
            Target::Unix(path) => UnixStream::connect(path).map(Stream::Unix),
            Target::Vsock { cid, port } => {
                VsockStream::connect_with_cid_port(*cid, *port).map(Stream::Vsock)
            }
        }
    }

    pub fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Unix(s) => s.try_clone().map(Stream::Unix),
            Stream::Vsock(s) => s.try_clone().map(Stream::Vsock),
        }
    }

    /// Close both directions, waking a thread blocked reading a clone. Errors (already
    /// closed) change nothing.
    pub fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Vsock(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Vsock(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Vsock(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Vsock(s) => s.flush(),
        }
    }
}
