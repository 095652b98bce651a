//! The agent frame codec, sans-IO.
//!
//! Wire layout (all integers big-endian):
//! `u32 total_len` · `u16 magic 0x4D43` · `u8 version 1` · `u8 header_len 16` ·
//! `u32 stream_id` · `u16 flags` · `u16 name_len` · `u32 payload_len` · name · payload.
//! `total_len` counts the bytes after itself and must equal `16 + name_len + payload_len`.
//!
//! The decoder never owns a socket: the caller hands it the bytes it has buffered and gets
//! back what they hold and how many bytes that consumed. It allocates nothing, so no length
//! field can make it reserve memory; the caller's buffer is bounded by [`MAX_TOTAL`].

/// Frame magic, "MC".
pub const MAGIC: u16 = 0x4D43;
/// The only version this codec speaks.
pub const VERSION: u8 = 1;
/// Bytes of fixed header after `total_len`.
pub const HEADER_LEN: usize = 16;
/// Bytes of the outer length prefix.
pub const PREFIX_LEN: usize = 4;
/// Largest accepted `total_len`: 1 MiB of payload plus 4 KiB of header and name.
pub const MAX_TOTAL: usize = 1024 * 1024 + 4096;
/// Largest accepted process name.
pub const MAX_NAME: usize = 128;
/// Flag bit: the frame carries a notification (stream id 0).
pub const FLAG_NOTIFICATION: u16 = 0x0001;
/// The optional first line naming the client: `\0TOOLWALL_META:<name>\n`.
pub const META_PREFIX: &[u8] = b"\0TOOLWALL_META:";
/// Largest meta line, newline included.
pub const MAX_META_LINE: usize = 4096;

/// The fixed header of a well-formed frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub stream_id: u32,
    pub flags: u16,
    pub name_len: u16,
    pub payload_len: u32,
}

impl Header {
    pub fn is_notification(&self) -> bool {
        self.flags & FLAG_NOTIFICATION != 0
    }
}

/// A fault inside a frame whose outer length was sound: the frame is skipped, the
/// stream id (always readable, at a fixed offset) gets a JSON-RPC -32600 and the
/// connection lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameFault {
    BadMagic(u16),
    BadVersion(u8),
    BadHeaderLen(u8),
    BadFlags(u16),
    NameTooLong(u16),
    NameNotUtf8,
    LengthMismatch { total: u32, name: u16, payload: u32 },
}

impl std::fmt::Display for FrameFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            FrameFault::BadMagic(m) => write!(f, "bad frame magic 0x{m:04x}"),
            FrameFault::BadVersion(v) => write!(f, "unsupported frame version {v}"),
            FrameFault::BadHeaderLen(h) => write!(f, "bad frame header length {h}"),
            FrameFault::BadFlags(fl) => write!(f, "invalid frame flags 0x{fl:04x}"),
            FrameFault::NameTooLong(n) => {
                write!(f, "process name of {n} bytes exceeds {MAX_NAME}")
            }
            FrameFault::NameNotUtf8 => write!(f, "process name is not UTF-8"),
            FrameFault::LengthMismatch {
                total,
                name,
                payload,
            } => write!(
                f,
                "frame length {total} does not equal 16 + name {name} + payload {payload}"
            ),
        }
    }
}

/// A fault that makes the byte stream unframeable: the connection must close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FatalFault {
    /// `total_len` outside `16..=MAX_TOTAL`.
    BadOuterLength(u32),
    /// The meta line is longer than [`MAX_META_LINE`].
    MetaTooLong,
    /// The meta line is not UTF-8.
    MetaNotUtf8,
}

impl std::fmt::Display for FatalFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            FatalFault::BadOuterLength(n) => write!(
                f,
                "frame length {n} outside {HEADER_LEN}..={MAX_TOTAL}; closing the connection"
            ),
            FatalFault::MetaTooLong => write!(f, "meta line exceeds {MAX_META_LINE} bytes"),
            FatalFault::MetaNotUtf8 => write!(f, "meta line is not UTF-8"),
        }
    }
}

/// What the next bytes of a buffer hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// Not enough bytes yet.
    NeedMore,
    /// The meta line; `name` excludes prefix and newline.
    Meta { name: &'a str, consumed: usize },
    /// A well-formed frame.
    Frame {
        header: Header,
        name: &'a str,
        payload: &'a [u8],
        consumed: usize,
    },
    /// A frame with a sound outer length but a bad inner header; skip `consumed` bytes.
    Invalid {
        stream_id: u32,
        fault: FrameFault,
        consumed: usize,
    },
}

/// Decoder state: whether the optional meta line may still come.
#[derive(Debug, Default, Clone)]
pub struct Decoder {
    past_start: bool,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decode the first item of `buf`. On `Ok` with a `consumed` count, the caller drops
    /// that many bytes from its buffer and calls again.
    pub fn decode<'a>(&mut self, buf: &'a [u8]) -> Result<Decoded<'a>, FatalFault> {
        if !self.past_start {
            match meta_line(buf)? {
                MetaProbe::NeedMore => return Ok(Decoded::NeedMore),
                MetaProbe::Meta(name, consumed) => {
                    self.past_start = true;
                    return Ok(Decoded::Meta { name, consumed });
                }
                MetaProbe::NotMeta => self.past_start = true,
            }
        }
        decode_frame(buf)
    }
}

enum MetaProbe<'a> {
    NeedMore,
    NotMeta,
    Meta(&'a str, usize),
}

// A frame's first byte is always 0 (total_len ≤ MAX_TOTAL < 2^24), so is the meta line's;
// the second byte tells them apart: 'T' would make total_len exceed MAX_TOTAL.
fn meta_line(buf: &[u8]) -> Result<MetaProbe<'_>, FatalFault> {
    let common = buf.len().min(META_PREFIX.len());
    if buf[..common] != META_PREFIX[..common] {
        return Ok(MetaProbe::NotMeta);
    }
    if buf.len() < META_PREFIX.len() {
        return Ok(MetaProbe::NeedMore);
    }
    let window = &buf[..buf.len().min(MAX_META_LINE)];
    match window.iter().position(|&b| b == b'\n') {
        Some(nl) => {
            let name = std::str::from_utf8(&buf[META_PREFIX.len()..nl])
                .map_err(|_| FatalFault::MetaNotUtf8)?;
            Ok(MetaProbe::Meta(name, nl + 1))
        }
        None if buf.len() >= MAX_META_LINE => Err(FatalFault::MetaTooLong),
        None => Ok(MetaProbe::NeedMore),
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Decode one frame (no meta line handling).
pub fn decode_frame(buf: &[u8]) -> Result<Decoded<'_>, FatalFault> {
    if buf.len() < PREFIX_LEN {
        return Ok(Decoded::NeedMore);
    }
    let total = be32(buf, 0);
    if (total as usize) < HEADER_LEN || total as usize > MAX_TOTAL {
        return Err(FatalFault::BadOuterLength(total));
    }
    let consumed = PREFIX_LEN + total as usize;
    if buf.len() < consumed {
        return Ok(Decoded::NeedMore);
    }
    let h = &buf[PREFIX_LEN..consumed];
    let stream_id = be32(h, 4);
    let invalid = |fault| {
        Ok(Decoded::Invalid {
            stream_id,
            fault,
            consumed,
        })
    };
    let magic = be16(h, 0);
    if magic != MAGIC {
        return invalid(FrameFault::BadMagic(magic));
    }
    if h[2] != VERSION {
        return invalid(FrameFault::BadVersion(h[2]));
    }
    if h[3] as usize != HEADER_LEN {
        return invalid(FrameFault::BadHeaderLen(h[3]));
    }
    let flags = be16(h, 8);
    if flags & !FLAG_NOTIFICATION != 0 {
        return invalid(FrameFault::BadFlags(flags));
    }
    let name_len = be16(h, 10);
    let payload_len = be32(h, 12);
    if HEADER_LEN as u64 + name_len as u64 + payload_len as u64 != total as u64 {
        return invalid(FrameFault::LengthMismatch {
            total,
            name: name_len,
            payload: payload_len,
        });
    }
    if name_len as usize > MAX_NAME {
        return invalid(FrameFault::NameTooLong(name_len));
    }
    let name_end = HEADER_LEN + name_len as usize;
    let Ok(name) = std::str::from_utf8(&h[HEADER_LEN..name_end]) else {
        return invalid(FrameFault::NameNotUtf8);
    };
    Ok(Decoded::Frame {
        header: Header {
            stream_id,
            flags,
            name_len,
            payload_len,
        },
        name,
        payload: &h[name_end..],
        consumed,
    })
}

/// Why a frame could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeError {
    NameTooLong(usize),
    TooLarge(usize),
}

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            EncodeError::NameTooLong(n) => {
                write!(f, "process name of {n} bytes exceeds {MAX_NAME}")
            }
            EncodeError::TooLarge(n) => {
                write!(f, "frame of {n} bytes exceeds the limit of {MAX_TOTAL}")
            }
        }
    }
}

impl std::error::Error for EncodeError {}

/// Bytes a frame with this name and payload occupies on the wire.
pub fn encoded_len(name_len: usize, payload_len: usize) -> usize {
    PREFIX_LEN + HEADER_LEN + name_len + payload_len
}

/// Append one frame to `out`.
pub fn encode(
    out: &mut Vec<u8>,
    stream_id: u32,
    flags: u16,
    name: &str,
    payload: &[u8],
) -> Result<(), EncodeError> {
    if name.len() > MAX_NAME {
        return Err(EncodeError::NameTooLong(name.len()));
    }
    let total = HEADER_LEN + name.len() + payload.len();
    if total > MAX_TOTAL {
        return Err(EncodeError::TooLarge(total));
    }
    out.reserve(PREFIX_LEN + total);
    out.extend_from_slice(&(total as u32).to_be_bytes());
    out.extend_from_slice(&MAGIC.to_be_bytes());
    out.push(VERSION);
    out.push(HEADER_LEN as u8);
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// The meta line for a client name (control characters are the caller's to clean).
pub fn meta_line_for(name: &str) -> Vec<u8> {
    let mut line = META_PREFIX.to_vec();
    line.extend_from_slice(name.as_bytes());
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(stream_id: u32, flags: u16, name: &str, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(&mut out, stream_id, flags, name, payload).unwrap();
        out
    }

    #[test]
    fn round_trip() {
        let bytes = frame(7, 0, "claude", b"{\"x\":1}");
        let mut d = Decoder::new();
        match d.decode(&bytes).unwrap() {
            Decoded::Frame {
                header,
                name,
                payload,
                consumed,
            } => {
                assert_eq!(header.stream_id, 7);
                assert_eq!(name, "claude");
                assert_eq!(payload, b"{\"x\":1}");
                assert_eq!(consumed, bytes.len());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn need_more_at_every_split() {
        let bytes = frame(1, 0, "n", b"[]");
        for cut in 0..bytes.len() {
            assert_eq!(
                Decoder::new().decode(&bytes[..cut]).unwrap(),
                Decoded::NeedMore,
                "cut {cut}"
            );
        }
    }

    #[test]
    fn meta_then_frame() {
        let mut bytes = meta_line_for("agent-1");
        bytes.extend(frame(1, 0, "", b"{}"));
        let mut d = Decoder::new();
        let Decoded::Meta { name, consumed } = d.decode(&bytes).unwrap() else {
            panic!()
        };
        assert_eq!(name, "agent-1");
        assert!(matches!(
            d.decode(&bytes[consumed..]).unwrap(),
            Decoded::Frame { .. }
        ));
        // A second meta line is not accepted: it reads as a bad outer length.
        let again = meta_line_for("x");
        assert!(d.decode(&again).is_err());
    }

    #[test]
    fn meta_prefix_split_waits() {
        let line = meta_line_for("abc");
        for cut in 1..line.len() {
            assert_eq!(
                Decoder::new().decode(&line[..cut]).unwrap(),
                Decoded::NeedMore
            );
        }
    }

    #[test]
    fn meta_too_long_is_fatal() {
        let mut line = META_PREFIX.to_vec();
        line.resize(MAX_META_LINE, b'a');
        assert_eq!(Decoder::new().decode(&line), Err(FatalFault::MetaTooLong));
    }

    #[test]
    fn outer_length_bounds() {
        let mut big = ((MAX_TOTAL + 1) as u32).to_be_bytes().to_vec();
        big.extend([0; 16]);
        assert!(matches!(
            decode_frame(&big),
            Err(FatalFault::BadOuterLength(_))
        ));
        let small = 15u32.to_be_bytes();
        assert!(decode_frame(&small).is_err());
    }

    #[test]
    fn inner_faults_keep_stream_id() {
        let good = frame(9, 0, "ab", b"{}");
        let cases: Vec<(usize, u8, FrameFault)> = vec![
            (4, 0x00, FrameFault::BadMagic(0x0043)),
            (6, 2, FrameFault::BadVersion(2)),
            (7, 15, FrameFault::BadHeaderLen(15)),
            (13, 0x02, FrameFault::BadFlags(0x0002)),
            (20, 0xff, FrameFault::NameNotUtf8),
        ];
        for (at, byte, fault) in cases {
            let mut b = good.clone();
            b[at] = byte;
            assert_eq!(
                decode_frame(&b).unwrap(),
                Decoded::Invalid {
                    stream_id: 9,
                    fault,
                    consumed: good.len()
                }
            );
        }
        let mut mismatch = good.clone();
        mismatch[19] = 5; // payload_len 5, but only 2 bytes follow the name
        assert!(matches!(
            decode_frame(&mismatch).unwrap(),
            Decoded::Invalid {
                stream_id: 9,
                fault: FrameFault::LengthMismatch { .. },
                ..
            }
        ));
    }

    #[test]
    fn name_too_long() {
        let name = "x".repeat(MAX_NAME + 1);
        assert_eq!(
            encode(&mut Vec::new(), 1, 0, &name, b""),
            Err(EncodeError::NameTooLong(MAX_NAME + 1))
        );
        // Hand-built: the decoder refuses it on the stream.
        let payload = b"{}";
        let total = (HEADER_LEN + name.len() + payload.len()) as u32;
        let mut b = total.to_be_bytes().to_vec();
        b.extend(MAGIC.to_be_bytes());
        b.extend([VERSION, HEADER_LEN as u8]);
        b.extend(3u32.to_be_bytes());
        b.extend(0u16.to_be_bytes());
        b.extend((name.len() as u16).to_be_bytes());
        b.extend((payload.len() as u32).to_be_bytes());
        b.extend(name.as_bytes());
        b.extend(payload);
        assert!(matches!(
            decode_frame(&b).unwrap(),
            Decoded::Invalid {
                stream_id: 3,
                fault: FrameFault::NameTooLong(129),
                ..
            }
        ));
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_consumes_within_bounds(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            let mut d = Decoder::new();
            let mut rest: &[u8] = &bytes;
            loop {
                match d.decode(rest) {
                    Ok(Decoded::NeedMore) | Err(_) => break,
                    Ok(Decoded::Meta { consumed, .. })
                    | Ok(Decoded::Frame { consumed, .. })
                    | Ok(Decoded::Invalid { consumed, .. }) => {
                        proptest::prop_assert!(consumed > 0 && consumed <= rest.len());
                        rest = &rest[consumed..];
                    }
                }
            }
        }

        #[test]
        fn encode_decode_identity(sid in 1u32.., name in "[a-z]{0,128}", payload in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let mut out = Vec::new();
            encode(&mut out, sid, 0, &name, &payload).unwrap();
            let decoded = decode_frame(&out).unwrap();
            match decoded {
                Decoded::Frame { header, name: n, payload: p, consumed } => {
                    proptest::prop_assert_eq!(header.stream_id, sid);
                    proptest::prop_assert_eq!(n, name.as_str());
                    proptest::prop_assert_eq!(p, &payload[..]);
                    proptest::prop_assert_eq!(consumed, out.len());
                }
                _ => proptest::prop_assert!(false),
            }
        }
    }
}
