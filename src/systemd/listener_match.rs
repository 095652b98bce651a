//! Which configured door serves on which socket systemd passed, and which doors toolwall
//! must still bind itself. A pure decision over descriptions; no socket is touched.
//!
//! The kernel's description of a socket ([`SocketKind`]) decides which door it can be:
//! a TCP socket only ever serves the HTTP door (which checks tokens), never a framed door
//! (which trusts peer credentials), whatever its `FileDescriptorName=` says. Within a
//! transport, a socket is taken by a configured door when its address equals the
//! configured one, or else when its name is the door's name (`mcp-unix`, `mcp-vsock`,
//! `mcp-http`); then systemd's address wins, since that is where clients connect, and the
//! difference is explained. A socket no configured door takes is not served: toolwall opens
//! no door the config does not ask for.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::listen_fds::{InheritedSocket, SocketKind};
use crate::config::ListenConfig;

/// `FileDescriptorName=` of the framed unix door's socket unit.
pub const DOOR_UNIX: &str = "mcp-unix";
/// `FileDescriptorName=` of the framed vsock door's socket unit.
pub const DOOR_VSOCK: &str = "mcp-vsock";
/// `FileDescriptorName=` of the HTTP door's socket unit.
pub const DOOR_HTTP: &str = "mcp-http";

/// The agent doors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Door {
    Unix,
    Vsock,
    Http,
}

impl Door {
    /// The `FileDescriptorName=` naming this door's socket.
    pub fn fd_name(self) -> &'static str {
        match self {
            Door::Unix => DOOR_UNIX,
            Door::Vsock => DOOR_VSOCK,
            Door::Http => DOOR_HTTP,
        }
    }

    fn by_name(name: &str) -> Option<Door> {
        [Door::Unix, Door::Vsock, Door::Http]
            .into_iter()
            .find(|d| d.fd_name() == name)
    }

    /// The door a socket of this kind can serve.
    fn by_kind(kind: &SocketKind) -> Option<Door> {
        match kind {
            SocketKind::Unix { .. } => Some(Door::Unix),
            SocketKind::Vsock { .. } => Some(Door::Vsock),
            SocketKind::Tcp { .. } => Some(Door::Http),
            SocketKind::Other { .. } => None,
        }
    }

    /// The config key that opens this door.
    fn config_key(self) -> &'static str {
        match self {
            Door::Unix => "[listen] unix",
            Door::Vsock => "[listen] vsock",
            Door::Http => "[listen] http",
        }
    }
}

/// A door the config asks for, with its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenerSpec {
    Unix { path: PathBuf },
    Vsock { port: u32 },
    Http { addr: SocketAddr },
}

impl ListenerSpec {
    pub fn door(&self) -> Door {
        match self {
            ListenerSpec::Unix { .. } => Door::Unix,
            ListenerSpec::Vsock { .. } => Door::Vsock,
            ListenerSpec::Http { .. } => Door::Http,
        }
    }

    /// Whether `kind` is exactly this address (vsock: the port, on any CID).
    fn same_address(&self, kind: &SocketKind) -> bool {
        match (self, kind) {
            (ListenerSpec::Unix { path }, SocketKind::Unix { path: got }) => path == got,
            (ListenerSpec::Vsock { port }, SocketKind::Vsock { port: got, .. }) => port == got,
            (ListenerSpec::Http { addr }, SocketKind::Tcp { addr: got }) => addr == got,
            _ => false,
        }
    }
}

impl std::fmt::Display for ListenerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenerSpec::Unix { path } => write!(f, "unix:{}", path.display()),
            ListenerSpec::Vsock { port } => write!(f, "vsock:any:{port}"),
            ListenerSpec::Http { addr } => write!(f, "tcp:{addr}"),
        }
    }
}

/// The doors `[listen]` opens, in the order the gateway binds them. (The HTTP door joins
/// this list with its config key.)
pub fn wanted_listeners(listen: &ListenConfig) -> Vec<ListenerSpec> {
    let mut wanted = Vec::new();
    if let Some(path) = listen.unix.as_ref().filter(|p| !p.as_os_str().is_empty()) {
        wanted.push(ListenerSpec::Unix { path: path.clone() });
    }
    if let Some(port) = listen.vsock {
        wanted.push(ListenerSpec::Vsock { port });
    }
    if let Some(addr) = listen.http {
        wanted.push(ListenerSpec::Http { addr });
    }
    wanted
}

/// The outcome of [`match_listeners`].
#[derive(Debug, Default)]
pub struct ListenerPlan {
    /// Doors served on a socket systemd passed: use the socket, do not bind, and do not
    /// remove a unix socket's file at exit (systemd owns it).
    pub adopted: Vec<(ListenerSpec, InheritedSocket)>,
    /// Doors systemd passed nothing for: bind them as without systemd.
    pub to_bind: Vec<ListenerSpec>,
    /// Passed sockets no door takes. Dropping them closes this process's copy only;
    /// systemd keeps listening, so the explanation tells the operator what to change.
    pub unused: Vec<InheritedSocket>,
    /// One line per mismatch, for the log (warnings: nothing unsafe was adopted).
    pub explanations: Vec<String>,
}

/// Decides which configured door (`wanted`, from [`wanted_listeners`]) serves on which
/// inherited socket, which doors must still be bound, and explains every mismatch.
pub fn match_listeners(inherited: Vec<InheritedSocket>, wanted: &[ListenerSpec]) -> ListenerPlan {
    let mut plan = ListenerPlan::default();
    let mut pool: Vec<Option<InheritedSocket>> = inherited.into_iter().map(Some).collect();

    for spec in wanted {
        let door = spec.door();
        let serves = |s: &InheritedSocket| Door::by_kind(&s.kind) == Some(door);
        let exact = pool.iter().position(|s| {
            s.as_ref()
                .is_some_and(|s| serves(s) && spec.same_address(&s.kind))
        });
        let named = || {
            pool.iter().position(|s| {
                s.as_ref()
                    .is_some_and(|s| serves(s) && s.name == door.fd_name())
            })
        };
        let Some(index) = exact.or_else(named) else {
            plan.to_bind.push(spec.clone());
            continue;
        };
        let Some(socket) = pool[index].take() else {
            continue;
        };
        if !spec.same_address(&socket.kind) {
            plan.explanations.push(format!(
                "{} {} serves on {} as systemd passed it, not on {spec} as the config says; make {} and the socket unit agree",
                door.fd_name(),
                describe_door(door),
                socket.kind,
                door.config_key()
            ));
        }
        match Door::by_name(&socket.name) {
            Some(named) if named != door => plan.explanations.push(format!(
                "{}: named {:?} but it is {}; serving it as the {} door by its address (set FileDescriptorName={} in its socket unit)",
                socket.describe(),
                socket.name,
                socket.kind,
                describe_door(door),
                door.fd_name()
            )),
            _ => {}
        }
        plan.adopted.push((spec.clone(), socket));
    }

    for socket in pool.into_iter().flatten() {
        plan.explanations.push(explain_unused(&socket, wanted));
        plan.unused.push(socket);
    }
    plan
}

fn describe_door(door: Door) -> &'static str {
    match door {
        Door::Unix => "(framed unix)",
        Door::Vsock => "(framed vsock)",
        Door::Http => "(HTTP)",
    }
}

/// Why a passed socket serves no door.
fn explain_unused(socket: &InheritedSocket, wanted: &[ListenerSpec]) -> String {
    let what = socket.describe();
    let by_name = Door::by_name(&socket.name);
    let Some(door) = Door::by_kind(&socket.kind) else {
        return format!(
            "{what}: not a listening unix, vsock or TCP stream socket; not served (check the socket unit's Listen*= line)"
        );
    };
    if let Some(named) = by_name.filter(|n| *n != door) {
        return format!(
            "{what}: named {:?} for the {} door but it is {}; not served (fix FileDescriptorName= or the Listen*= address of its socket unit)",
            socket.name,
            describe_door(named),
            socket.kind
        );
    }
    match wanted.iter().find(|w| w.door() == door) {
        Some(taken) => format!(
            "{what}: the {} door is already served on {} and its address {} is not the configured {taken}; not served (remove it from the socket units, or fix the address)",
            describe_door(door),
            taken,
            socket.kind
        ),
        None => format!(
            "{what}: the config does not open the {} door ({} is not set); not served, though systemd keeps it listening (disable its socket unit or set {})",
            describe_door(door),
            door.config_key(),
            door.config_key()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::OwnedFd;

    /// A description paired with a real (but irrelevant) fd: the matcher never touches it.
    fn sock(name: &str, kind: SocketKind) -> InheritedSocket {
        let fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        InheritedSocket {
            fd,
            name: name.into(),
            kind,
        }
    }

    fn unix(p: &str) -> SocketKind {
        SocketKind::Unix { path: p.into() }
    }
    fn vsock(port: u32) -> SocketKind {
        SocketKind::Vsock {
            cid: u32::MAX,
            port,
        }
    }
    fn tcp(a: &str) -> SocketKind {
        SocketKind::Tcp {
            addr: a.parse().unwrap(),
        }
    }
    fn want_unix(p: &str) -> ListenerSpec {
        ListenerSpec::Unix { path: p.into() }
    }
    fn want_http(a: &str) -> ListenerSpec {
        ListenerSpec::Http {
            addr: a.parse().unwrap(),
        }
    }

    fn adopted_names(plan: &ListenerPlan) -> Vec<(Door, String)> {
        plan.adopted
            .iter()
            .map(|(spec, s)| (spec.door(), s.name.clone()))
            .collect()
    }

    #[test]
    fn the_shipped_units_match_the_example_config() {
        let inherited = vec![
            sock(DOOR_UNIX, unix("/run/toolwall/mcp.sock")),
            sock(DOOR_VSOCK, vsock(5002)),
            sock(DOOR_HTTP, tcp("127.0.0.1:9210")),
        ];
        let wanted = [
            want_unix("/run/toolwall/mcp.sock"),
            ListenerSpec::Vsock { port: 5002 },
            want_http("127.0.0.1:9210"),
        ];
        let plan = match_listeners(inherited, &wanted);
        assert_eq!(
            adopted_names(&plan),
            vec![
                (Door::Unix, DOOR_UNIX.into()),
                (Door::Vsock, DOOR_VSOCK.into()),
                (Door::Http, DOOR_HTTP.into())
            ]
        );
        assert!(plan.to_bind.is_empty() && plan.unused.is_empty());
        assert!(plan.explanations.is_empty(), "{:?}", plan.explanations);
    }

    #[test]
    fn nothing_inherited_binds_everything() {
        let wanted = [
            want_unix("/run/toolwall/mcp.sock"),
            ListenerSpec::Vsock { port: 5002 },
        ];
        let plan = match_listeners(Vec::new(), &wanted);
        assert!(plan.adopted.is_empty());
        assert_eq!(plan.to_bind, wanted.to_vec());
        assert!(plan.explanations.is_empty());
    }

    #[test]
    fn doors_systemd_did_not_pass_are_still_bound() {
        let inherited = vec![sock(DOOR_UNIX, unix("/run/toolwall/mcp.sock"))];
        let wanted = [
            want_unix("/run/toolwall/mcp.sock"),
            ListenerSpec::Vsock { port: 5002 },
        ];
        let plan = match_listeners(inherited, &wanted);
        assert_eq!(adopted_names(&plan), vec![(Door::Unix, DOOR_UNIX.into())]);
        assert_eq!(plan.to_bind, vec![ListenerSpec::Vsock { port: 5002 }]);
        assert!(plan.explanations.is_empty());
    }

    #[test]
    fn unnamed_sockets_match_by_address() {
        // One socket unit holding every Listen line gives every fd the unit's name.
        let inherited = vec![
            sock("toolwall.socket", tcp("127.0.0.1:9210")),
            sock("toolwall.socket", unix("/run/toolwall/mcp.sock")),
        ];
        let wanted = [
            want_unix("/run/toolwall/mcp.sock"),
            want_http("127.0.0.1:9210"),
        ];
        let plan = match_listeners(inherited, &wanted);
        assert_eq!(plan.adopted.len(), 2);
        assert_eq!(plan.adopted[0].0.door(), Door::Unix);
        assert_eq!(plan.adopted[1].0.door(), Door::Http);
        assert!(plan.explanations.is_empty(), "{:?}", plan.explanations);
    }

    #[test]
    fn a_named_socket_at_another_address_wins_and_is_explained() {
        let inherited = vec![sock(DOOR_UNIX, unix("/run/other/agents.sock"))];
        let plan = match_listeners(inherited, &[want_unix("/run/toolwall/mcp.sock")]);
        assert_eq!(adopted_names(&plan), vec![(Door::Unix, DOOR_UNIX.into())]);
        assert!(plan.to_bind.is_empty());
        assert_eq!(plan.explanations.len(), 1);
        let e = &plan.explanations[0];
        assert!(
            e.contains("/run/other/agents.sock") && e.contains("/run/toolwall/mcp.sock"),
            "{e}"
        );
        assert!(e.contains("[listen] unix"), "{e}");
    }

    #[test]
    fn a_tcp_socket_never_serves_a_framed_door_whatever_its_name() {
        let inherited = vec![sock(DOOR_UNIX, tcp("0.0.0.0:5002"))];
        let plan = match_listeners(
            inherited,
            &[
                want_unix("/run/toolwall/mcp.sock"),
                ListenerSpec::Vsock { port: 5002 },
            ],
        );
        assert!(plan.adopted.is_empty());
        assert_eq!(plan.to_bind.len(), 2);
        assert_eq!(plan.unused.len(), 1);
        let e = &plan.explanations[0];
        assert!(
            e.contains("\"mcp-unix\"")
                && e.contains("tcp:0.0.0.0:5002")
                && e.contains("not served"),
            "{e}"
        );
    }

    #[test]
    fn a_misnamed_socket_at_the_configured_address_is_served_and_explained() {
        let inherited = vec![sock(DOOR_VSOCK, tcp("127.0.0.1:9210"))];
        let plan = match_listeners(inherited, &[want_http("127.0.0.1:9210")]);
        assert_eq!(adopted_names(&plan), vec![(Door::Http, DOOR_VSOCK.into())]);
        assert_eq!(plan.explanations.len(), 1);
        assert!(
            plan.explanations[0].contains("FileDescriptorName=mcp-http"),
            "{:?}",
            plan.explanations
        );
    }

    #[test]
    fn a_door_the_config_does_not_open_stays_closed() {
        let inherited = vec![
            sock(DOOR_UNIX, unix("/run/toolwall/mcp.sock")),
            sock(DOOR_HTTP, tcp("127.0.0.1:9210")),
        ];
        let plan = match_listeners(inherited, &[want_unix("/run/toolwall/mcp.sock")]);
        assert_eq!(plan.adopted.len(), 1);
        assert_eq!(plan.unused.len(), 1);
        assert_eq!(plan.unused[0].name, DOOR_HTTP);
        let e = &plan.explanations[0];
        assert!(
            e.contains("[listen] http is not set") && e.contains("disable its socket unit"),
            "{e}"
        );
    }

    #[test]
    fn a_second_socket_for_one_door_is_refused() {
        let inherited = vec![
            sock(DOOR_UNIX, unix("/run/a.sock")),
            sock(DOOR_UNIX, unix("/run/toolwall/mcp.sock")),
        ];
        let plan = match_listeners(inherited, &[want_unix("/run/toolwall/mcp.sock")]);
        // The exact address wins over the first by name.
        assert_eq!(plan.adopted.len(), 1);
        assert_eq!(plan.adopted[0].1.kind, unix("/run/toolwall/mcp.sock"));
        assert_eq!(plan.unused.len(), 1);
        assert!(
            plan.explanations[0].contains("already served"),
            "{:?}",
            plan.explanations
        );
    }

    #[test]
    fn sockets_toolwall_cannot_serve_are_explained() {
        let inherited = vec![sock(
            DOOR_UNIX,
            SocketKind::Other {
                what: "Datagram socket on unix:/run/toolwall/mcp.sock, not a stream socket".into(),
            },
        )];
        let plan = match_listeners(inherited, &[want_unix("/run/toolwall/mcp.sock")]);
        assert!(plan.adopted.is_empty());
        assert_eq!(plan.to_bind.len(), 1);
        assert!(
            plan.explanations[0].contains("not a listening unix, vsock or TCP stream socket"),
            "{:?}",
            plan.explanations
        );
    }

    #[test]
    fn vsock_matches_by_port_on_any_cid() {
        let inherited = vec![sock(
            "toolwall-vsock.socket",
            SocketKind::Vsock { cid: 2, port: 5002 },
        )];
        let plan = match_listeners(inherited, &[ListenerSpec::Vsock { port: 5002 }]);
        assert_eq!(plan.adopted.len(), 1);
        assert!(plan.explanations.is_empty());
    }

    #[test]
    fn wanted_from_config() {
        let mut listen = ListenConfig {
            unix: Some("/run/toolwall/mcp.sock".into()),
            vsock: Some(5002),
            ..ListenConfig::default()
        };
        assert_eq!(
            wanted_listeners(&listen),
            vec![
                want_unix("/run/toolwall/mcp.sock"),
                ListenerSpec::Vsock { port: 5002 }
            ]
        );
        listen.unix = Some(PathBuf::new());
        listen.vsock = None;
        assert!(wanted_listeners(&listen).is_empty());
    }
}
