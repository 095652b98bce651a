//! What a worker reports about its confinement, and the gateway's verdict on it.

use serde::{Deserialize, Serialize};

use super::SandboxMode;
use super::attest::{probes_allowed_by_design, required_probes};

/// How much of the requested Landlock ruleset the kernel enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LandlockState {
    FullyEnforced,
    PartiallyEnforced,
    NotEnforced,
}

impl LandlockState {
    pub fn as_str(self) -> &'static str {
        match self {
            LandlockState::FullyEnforced => "fully_enforced",
            LandlockState::PartiallyEnforced => "partially_enforced",
            LandlockState::NotEnforced => "not_enforced",
        }
    }
}

/// Sent by the worker in its ready message; shown by `toolwall status` and recorded.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ConfinementReport {
    pub role: String,
    /// The kernel's Landlock ABI (0: no Landlock).
    pub landlock_abi: i32,
    /// `fully_enforced`, `partially_enforced` or `not_enforced`.
    pub landlock: String,
    /// Both seccomp filters of the role are installed.
    pub seccomp: bool,
    pub no_new_privs: bool,
    /// Effective, permitted and inheritable capabilities are empty.
    #[serde(default)]
    pub capabilities_cleared: bool,
    /// The capability bounding set is empty (nothing executed can ever gain a capability).
    /// A worker of a gateway without `CAP_SETPCAP` cannot empty it; no_new_privs covers it.
    #[serde(default)]
    pub bounding_set_cleared: bool,
    /// `enforce` or `warn`: the mode the worker confined itself in.
    pub mode: String,
    /// The real, effective and saved user and group ids the worker runs as (all equal, or
    /// the first one that differs is reported); a host of agent programs must show the
    /// agent user's.
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    pub probes: Vec<Probe>,
    /// Facts worth knowing that are not failures (a missing read path, a warn-mode gap).
    #[serde(default)]
    pub notes: Vec<String>,
}

/// One forbidden action tried after confinement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub name: String,
    pub denied: bool,
    /// The errno seen (or what happened instead), and which layer it points to.
    pub detail: String,
}

impl ConfinementReport {
    /// Every gap in the confinement, one line each; empty when it is complete.
    pub fn gaps(&self) -> Vec<String> {
        self.gaps_with(&[], &[]).0
    }

    /// [`ConfinementReport::gaps`], with `extra` probes required too (each denied), and
    /// the probes of `allowed` (configured exceptions) turned from gaps into warnings.
    /// Returns (gaps, warnings).
    pub fn gaps_with(&self, extra: &[String], allowed: &[String]) -> (Vec<String>, Vec<String>) {
        let mut gaps = Vec::new();
        let mut warnings = Vec::new();
        if self.landlock != LandlockState::FullyEnforced.as_str() {
            gaps.push(format!(
                "landlock is {} (kernel ABI {})",
                self.landlock, self.landlock_abi
            ));
        }
        if !self.seccomp {
            gaps.push("seccomp filter not installed".to_string());
        }
        if !self.no_new_privs {
            gaps.push("no_new_privs not set".to_string());
        }
        if !self.capabilities_cleared {
            gaps.push("capabilities not cleared".to_string());
        }
        let role_required = required_probes(&self.role);
        let by_design = probes_allowed_by_design(&self.role);
        let required: Vec<&str> = role_required
            .iter()
            .copied()
            .chain(extra.iter().map(String::as_str))
            .collect();
        let not_denied = |probe: &Probe, gaps: &mut Vec<String>, warnings: &mut Vec<String>| {
            let line = format!("probe {} was not denied: {}", probe.name, probe.detail);
            if allowed.contains(&probe.name) {
                warnings.push(line);
            } else {
                gaps.push(line);
            }
        };
        for required in &required {
            let found: Vec<&Probe> = self.probes.iter().filter(|p| p.name == *required).collect();
            match found.as_slice() {
                [] => gaps.push(format!("probe {required} missing from the report")),
                [probe] if probe.denied || by_design.contains(required) => {}
                [probe] => not_denied(probe, &mut gaps, &mut warnings),
                _ => gaps.push(format!("probe {required} reported more than once")),
            }
        }
        for probe in &self.probes {
            if !required.contains(&probe.name.as_str()) && !probe.denied {
                not_denied(probe, &mut gaps, &mut warnings);
            }
        }
        (gaps, warnings)
    }

    /// The gateway's decision. `enforce`: every required probe of the role present and
    /// denied (those the role needs, such as the workspace's fork and exec, present), Landlock
    /// fully enforced, seccomp, no_new_privs and cleared capabilities, else `Err` naming
    /// every gap (the worker must get no work). `warn`: `Ok` with one loud warning per gap.
    pub fn verdict(&self, mode: SandboxMode) -> Result<Vec<String>, String> {
        self.verdict_with(mode, &[], &[])
    }

    /// [`ConfinementReport::verdict`] with the worker's extra and allowed probes (see
    /// [`ConfinementReport::gaps_with`]); the allowed ones come back as loud warnings.
    pub fn verdict_with(
        &self,
        mode: SandboxMode,
        extra: &[String],
        allowed: &[String],
    ) -> Result<Vec<String>, String> {
        let (gaps, configured) = self.gaps_with(extra, allowed);
        let configured = configured
            .into_iter()
            .map(|w| format!("{} worker runs with a configured exception: {w}", self.role));
        match mode {
            SandboxMode::Enforce if gaps.is_empty() => Ok(configured.collect()),
            SandboxMode::Enforce => Err(format!(
                "{} worker is not confined: {}",
                self.role,
                gaps.join("; ")
            )),
            SandboxMode::Warn => Ok(gaps
                .into_iter()
                .map(|g| format!("UNCONFINED {} worker (sandbox mode warn): {g}", self.role))
                .chain(configured)
                .collect()),
        }
    }
}
