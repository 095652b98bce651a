//! The gateway's verdict on a report: fail closed in enforce mode, loud in warn mode.

use super::super::{ConfinementReport, Probe, REQUIRED_PROBES, SandboxMode};

fn confined_report() -> ConfinementReport {
    ConfinementReport {
        role: "builtin".to_string(),
        landlock_abi: 7,
        landlock: "fully_enforced".to_string(),
        seccomp: true,
        no_new_privs: true,
        capabilities_cleared: true,
        bounding_set_cleared: true,
        mode: "enforce".to_string(),
        uid: None,
        gid: None,
        probes: REQUIRED_PROBES
            .iter()
            .map(|name| Probe {
                name: name.to_string(),
                denied: true,
                detail: "denied: EPERM".to_string(),
            })
            .collect(),
        notes: Vec::new(),
    }
}

#[test]
fn a_fully_confined_report_passes() {
    assert_eq!(
        confined_report().verdict(SandboxMode::Enforce),
        Ok(Vec::new())
    );
    assert_eq!(confined_report().verdict(SandboxMode::Warn), Ok(Vec::new()));
}

#[test]
fn one_failed_probe_refuses_the_worker_and_names_the_probe() {
    for name in REQUIRED_PROBES {
        let mut report = confined_report();
        for probe in &mut report.probes {
            if probe.name == *name {
                probe.denied = false;
                probe.detail = "created /tmp/x".to_string();
            }
        }
        let why = report
            .verdict(SandboxMode::Enforce)
            .expect_err("a failed probe must refuse");
        assert!(
            why.contains(name) && why.contains("created /tmp/x"),
            "{why}"
        );
    }
}

#[test]
fn a_missing_or_duplicated_probe_refuses_the_worker() {
    let mut missing = confined_report();
    missing.probes.retain(|p| p.name != "exec");
    let why = missing
        .verdict(SandboxMode::Enforce)
        .expect_err("missing probe");
    assert!(why.contains("exec") && why.contains("missing"), "{why}");

    let mut empty = confined_report();
    empty.probes.clear();
    assert!(empty.verdict(SandboxMode::Enforce).is_err());

    let mut twice = confined_report();
    let mut again = twice.probes[0].clone();
    again.denied = false;
    twice.probes.push(again);
    assert!(twice.verdict(SandboxMode::Enforce).is_err());
}

#[test]
fn an_extra_probe_that_was_not_denied_refuses_the_worker() {
    let mut report = confined_report();
    report.probes.push(Probe {
        name: "future_probe".to_string(),
        denied: false,
        detail: "allowed".to_string(),
    });
    assert!(report.verdict(SandboxMode::Enforce).is_err());
}

#[test]
fn incomplete_confinement_refuses_in_enforce_and_warns_in_warn() {
    type Break = fn(&mut ConfinementReport);
    let breaks: [(&str, Break); 4] = [
        ("landlock", |r| {
            r.landlock = "partially_enforced".to_string()
        }),
        ("seccomp", |r| r.seccomp = false),
        ("no_new_privs", |r| r.no_new_privs = false),
        ("capabilities", |r| r.capabilities_cleared = false),
    ];
    for (what, break_it) in breaks {
        let mut report = confined_report();
        break_it(&mut report);
        let why = report
            .verdict(SandboxMode::Enforce)
            .expect_err("an incomplete confinement must refuse");
        assert!(why.contains(what), "{why}");
        let warnings = report
            .verdict(SandboxMode::Warn)
            .expect("warn mode runs it");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("UNCONFINED") && warnings[0].contains(what));
    }
}

#[test]
fn the_report_survives_serialization() {
    let report = confined_report();
    let json = serde_json::to_string(&report).expect("serialize");
    let back: ConfinementReport = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back.verdict(SandboxMode::Enforce), Ok(Vec::new()));
    let bytes = rmp_serde::to_vec_named(&report).expect("msgpack");
    let back: ConfinementReport = rmp_serde::from_slice(&bytes).expect("msgpack back");
    assert_eq!(back.probes, report.probes);
}

fn workspace_report() -> ConfinementReport {
    let mut report = confined_report();
    report.role = "workspace".to_string();
    report.probes = super::super::WORKSPACE_PROBES
        .iter()
        .map(|name| Probe {
            name: name.to_string(),
            denied: !super::super::probes_allowed_by_design("workspace").contains(name),
            detail: "as expected".to_string(),
        })
        .collect();
    report
}

#[test]
fn a_workspace_may_fork_spawn_and_exec_but_nothing_else() {
    assert_eq!(
        workspace_report().verdict(SandboxMode::Enforce),
        Ok(Vec::new())
    );
    for name in super::super::WORKSPACE_PROBES {
        if super::super::probes_allowed_by_design("workspace").contains(name) {
            continue;
        }
        let mut report = workspace_report();
        for probe in &mut report.probes {
            if probe.name == *name {
                probe.denied = false;
            }
        }
        let why = report
            .verdict(SandboxMode::Enforce)
            .expect_err("a failed workspace probe must refuse");
        assert!(why.contains(name), "{why}");
    }
    // The workspace's own probes are required of it: missing one refuses it.
    let mut missing = workspace_report();
    missing
        .probes
        .retain(|p| p.name != "create_file_outside_root");
    assert!(missing.verdict(SandboxMode::Enforce).is_err());
    // A builtin worker that could fork is refused, whatever the workspace may do.
    let mut builtin = confined_report();
    for probe in &mut builtin.probes {
        if probe.name == "fork" {
            probe.denied = false;
        }
    }
    assert!(builtin.verdict(SandboxMode::Enforce).is_err());
    // A report that calls itself workspace must carry the workspace probes.
    let mut renamed = confined_report();
    renamed.role = "workspace".to_string();
    assert!(renamed.verdict(SandboxMode::Enforce).is_err());
}
