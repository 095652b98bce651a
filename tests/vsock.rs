//! The vsock listener. This machine can bind vsock but not connect to itself (no
//! loopback), so the framed protocol is tested over unix; here: binding, and the refusal
//! when the port cannot be had.

mod common;

use common::*;
use std::process::Command;

#[test]
fn vsock_listener_binds_and_a_taken_port_is_fatal() {
    if !std::path::Path::new("/dev/vsock").exists() {
        eprintln!("skipping: no /dev/vsock on this machine");
        return;
    }
    let port = 40_000 + (std::process::id() % 20_000);
    let dir = tempfile::tempdir().unwrap();
    let config = base_config(dir.path(), "").replace("[listen]\n", &format!("[listen]\nvsock = {port}\n"));
    let first = TestGateway::start_with(dir, &config);
    assert!(first.log().contains(&format!("vsock:any:{port}")), "{}", first.log());
    // A second gateway asking for the same port exits non-zero and says why.
    let dir2 = tempfile::tempdir().unwrap();
    let config2 = base_config(dir2.path(), "").replace("[listen]\n", &format!("[listen]\nvsock = {port}\n"));
    let path2 = dir2.path().join("toolwall.toml");
    std::fs::write(&path2, config2).unwrap();
    let out = Command::new(BIN).args(["serve", "--config"]).arg(&path2).current_dir(dir2.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("vsock") && err.contains(&port.to_string()), "{err}");
}
