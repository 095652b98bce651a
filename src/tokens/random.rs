//! Random bytes from the kernel (`getrandom(2)`), for token secrets and session ids.

use std::io;

/// Fill `buf` from the kernel's CSPRNG. Blocks only until the pool is initialised at boot.
pub fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: the pointer and length describe `rest`, a live, writable slice, and the
        // kernel writes at most `rest.len()` bytes into it.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        // n is non-negative and at most rest.len() here.
        filled += n as usize;
    }
    Ok(())
}

/// `N` random bytes.
pub fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut out = [0u8; N];
    fill_random(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_and_differs() {
        let a: [u8; 32] = random_bytes().unwrap();
        let b: [u8; 32] = random_bytes().unwrap();
        assert_ne!(a, b);
        assert_ne!(a, [0u8; 32]);
        let mut empty: [u8; 0] = [];
        fill_random(&mut empty).unwrap();
    }
}
