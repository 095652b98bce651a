//! The messages between the gateway and the agent launcher, one per `SOCK_SEQPACKET`
//! packet (the kernel keeps their boundaries). Sans-IO: bytes in, values out.
//!
//! - request `S`: `u8 'S'`, `u16 BE identity index`, role name (1-32 bytes), with two or
//!   three fds attached (`SCM_RIGHTS`): the worker's RPC socket, its stdin (the settings
//!   pipe), and the directory of the cgroup it must run in, when cgroups are in force;
//! - answer `P`: `u8 'P'`, `i32 BE pid` of the started worker;
//! - answer `E`: `u8 'E'`, `i32 BE pid` (0 when no process was created; otherwise the
//!   gateway must reap it), UTF-8 message (at most [`MAX_MESSAGE`] bytes).

/// Largest packet either side sends or accepts.
pub const MAX_PACKET: usize = 2048;
/// Longest error message in an `E` answer.
pub const MAX_MESSAGE: usize = 1024;
/// Longest role name.
pub const MAX_ROLE: usize = 32;
/// Most file descriptors attached to a request.
pub const REQUEST_FDS: usize = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnRequest {
    pub identity: u16,
    pub role: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpawnAnswer {
    Started { pid: i32 },
    Failed { pid: i32, message: String },
}

pub fn encode_request(req: &SpawnRequest) -> Result<Vec<u8>, String> {
    if req.role.is_empty() || req.role.len() > MAX_ROLE {
        return Err(format!("role name of {} bytes", req.role.len()));
    }
    let mut out = Vec::with_capacity(3 + req.role.len());
    out.push(b'S');
    out.extend_from_slice(&req.identity.to_be_bytes());
    out.extend_from_slice(req.role.as_bytes());
    Ok(out)
}

pub fn decode_request(bytes: &[u8]) -> Result<SpawnRequest, String> {
    if bytes.len() > 3 + MAX_ROLE {
        return Err(format!("request of {} bytes", bytes.len()));
    }
    match bytes {
        [b'S', hi, lo, role @ ..] if !role.is_empty() => Ok(SpawnRequest {
            identity: u16::from_be_bytes([*hi, *lo]),
            role: std::str::from_utf8(role)
                .map_err(|_| "role name is not UTF-8".to_string())?
                .to_string(),
        }),
        _ => Err(format!("malformed request of {} bytes", bytes.len())),
    }
}

pub fn encode_answer(answer: &SpawnAnswer) -> Vec<u8> {
    match answer {
        SpawnAnswer::Started { pid } => {
            let mut out = vec![b'P'];
            out.extend_from_slice(&pid.to_be_bytes());
            out
        }
        SpawnAnswer::Failed { pid, message } => {
            let mut out = vec![b'E'];
            out.extend_from_slice(&pid.to_be_bytes());
            let mut cut = message.len().min(MAX_MESSAGE);
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            out.extend_from_slice(&message.as_bytes()[..cut]);
            out
        }
    }
}

pub fn decode_answer(bytes: &[u8]) -> Result<SpawnAnswer, String> {
    if bytes.len() > 5 + MAX_MESSAGE {
        return Err(format!("answer of {} bytes", bytes.len()));
    }
    match bytes {
        [b'P', a, b, c, d] => Ok(SpawnAnswer::Started {
            pid: i32::from_be_bytes([*a, *b, *c, *d]),
        }),
        [b'E', a, b, c, d, message @ ..] => Ok(SpawnAnswer::Failed {
            pid: i32::from_be_bytes([*a, *b, *c, *d]),
            message: String::from_utf8_lossy(message).into_owned(),
        }),
        _ => Err(format!("malformed answer of {} bytes", bytes.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_round_trip() {
        let req = SpawnRequest {
            identity: 513,
            role: "workspace".into(),
        };
        assert_eq!(decode_request(&encode_request(&req).unwrap()), Ok(req));
        for answer in [
            SpawnAnswer::Started { pid: 4242 },
            SpawnAnswer::Failed {
                pid: 0,
                message: "no such user".into(),
            },
        ] {
            assert_eq!(decode_answer(&encode_answer(&answer)), Ok(answer));
        }
    }

    #[test]
    fn bad_packets_are_refused_and_long_messages_cut_on_a_character() {
        for bad in [
            &b""[..],
            b"S",
            b"S\x00\x01",
            b"X\x00\x01ws",
            b"S\x00\x01\xff",
        ] {
            assert!(decode_request(bad).is_err(), "{bad:?}");
        }
        assert!(decode_request(&[b'S'; 40]).is_err());
        assert!(
            encode_request(&SpawnRequest {
                identity: 0,
                role: String::new()
            })
            .is_err()
        );
        for bad in [&b""[..], b"P\x00", b"Q\x00\x00\x00\x01"] {
            assert!(decode_answer(bad).is_err(), "{bad:?}");
        }
        let long = "é".repeat(MAX_MESSAGE);
        let bytes = encode_answer(&SpawnAnswer::Failed {
            pid: 1,
            message: long,
        });
        assert!(bytes.len() <= 5 + MAX_MESSAGE);
        match decode_answer(&bytes) {
            Ok(SpawnAnswer::Failed { message, .. }) => assert!(message.chars().all(|c| c == 'é')),
            other => panic!("{other:?}"),
        }
    }
}
