//! The README says the ledger can be read with `sqlite3` while the gateway runs. An outside
//! read-write connection that reads and closes must not take the live WAL away: if the
//! gateway ever opened the database file outside SQLite and closed it, its POSIX locks were
//! gone, the outsider believed itself the last connection, checkpointed and deleted the
//! WAL, and rows the gateway committed afterwards were lost on a crash.

mod common;

use common::http::HttpGateway;
use common::*;
use serde_json::json;

fn deleted_ledger_files(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .flatten()
    {
        if let Ok(target) = std::fs::read_link(fd.path()) {
            let t = target.display().to_string();
            if t.contains("ledger.db") && t.ends_with("(deleted)") {
                out.push(t);
            }
        }
    }
    out
}

#[test]
fn an_outside_reader_leaves_the_live_wal_alone_and_no_committed_row_is_lost() {
    // The HTTP door opens the token store (in the ledger database) after the ledger.
    let mut gw = HttpGateway::start("", "");
    let mut c = gw.connect();
    c.tool("local__echo", json!({"text": "before"}));
    gw.wait_rows("the first row", |r| r.len() == 1);
    // What an operator does: a read-write sqlite connection that reads and closes.
    // (Python's sqlite3 module, a SQLite build other than ours, as an operator's would be.)
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3, sys\n\
             c = sqlite3.connect(sys.argv[1])\n\
             print(c.execute('SELECT count(*) FROM tool_calls').fetchone()[0])\n\
             c.close()",
        )
        .arg(&gw.ledger)
        .output()
        .expect("python3 runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1", "{out:?}");
    let pid = gw.pid();
    assert_eq!(
        deleted_ledger_files(pid),
        Vec::<String>::new(),
        "the live WAL was unlinked"
    );
    for i in 0..20 {
        let r = c.tool("local__echo", json!({"text": format!("after {i}")}));
        assert_eq!(r["result"]["content"][0]["text"], format!("after {i}"));
    }
    // Every answer the agent got has its committed row, even after a crash.
    let mut child = gw.gw.child.take().expect("running");
    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    let rows = query_json(
        &rusqlite::Connection::open(&gw.ledger).expect("open"),
        "SELECT * FROM tool_calls",
    );
    assert_eq!(rows.len(), 21, "rows lost after the outside reader");
}
