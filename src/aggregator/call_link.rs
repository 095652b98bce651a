//! One call as the aggregator worker's threads share it: the pool thread that runs the
//! call, and the worker's loop that receives the gateway's answers to relayed requests and
//! its cancellation. A cancellation wakes a thread waiting for an answer and shuts down the
//! sockets the call's HTTP requests use, so a thread blocked reading an upstream's stream
//! returns at once (that close is also the 2026-07-28 era's cancellation signal).
//!
//! The sockets are found by [`TrackingConnector`]: it wraps ureq's default connector and
//! records each new connection's shutdown handle for the link the current thread serves.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use ureq::unversioned::transport::{
    ConnectionDetails, Connector, DefaultConnector, ShutdownHandle, Transport,
};

use super::call_connections::CallBoundTransport;
use crate::workers::relay_wire::RequestAnswer;

/// Answers held for a call before its thread takes them; beyond this, answers for ids the
/// thread does not wait for are dropped.
const MAX_HELD_ANSWERS: usize = 64;

#[derive(Default)]
struct LinkState {
    cancelled: bool,
    answers: HashMap<u64, RequestAnswer>,
    /// The JSON-RPC id of the upstream request now under way (raw JSON), for a legacy
    /// `notifications/cancelled`.
    upstream_id: Option<String>,
    /// Bumped when one request of the call has its answer: the relayed requests that
    /// were waiting for the agent during it are over (see [`CallLink::end_waits`]).
    waits_epoch: u64,
}

/// One call's shared state.
pub struct CallLink {
    pub call: u64,
    state: Mutex<LinkState>,
    changed: Condvar,
    sockets: Mutex<Vec<Weak<dyn ShutdownHandle>>>,
    /// What else a cancellation must wake (a request waiting on a local server's pipe),
    /// alive while its owner holds it.
    hooks: Mutex<Vec<Weak<CancelHook>>>,
}

/// Run once when the call is cancelled.
pub type CancelHook = dyn Fn() + Send + Sync;

/// Why no answer came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoAnswer {
    Cancelled,
    TimedOut,
    /// The request it answers is over: the server answered its call without it.
    Over,
}

impl CallLink {
    pub fn new(call: u64) -> Arc<CallLink> {
        Arc::new(CallLink {
            call,
            state: Mutex::new(LinkState::default()),
            changed: Condvar::new(),
            sockets: Mutex::new(Vec::new()),
            hooks: Mutex::new(Vec::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_cancelled(&self) -> bool {
        self.lock().cancelled
    }

    /// The gateway cancelled the call: wake its thread and close its connections.
    pub fn cancel(&self) {
        self.lock().cancelled = true;
        self.changed.notify_all();
        let sockets = std::mem::take(&mut *self.sockets.lock().unwrap_or_else(|p| p.into_inner()));
        for socket in sockets.iter().filter_map(Weak::upgrade) {
            socket.shutdown();
        }
        let hooks = std::mem::take(&mut *self.hooks.lock().unwrap_or_else(|p| p.into_inner()));
        for hook in hooks.iter().filter_map(Weak::upgrade) {
            hook();
        }
    }

    /// Run `hook` when the call is cancelled (at once if it is already), as long as the
    /// caller keeps the `Arc`.
    pub fn on_cancel(&self, hook: &Arc<CancelHook>) {
        if self.is_cancelled() {
            hook();
            return;
        }
        let mut hooks = self.hooks.lock().unwrap_or_else(|p| p.into_inner());
        hooks.retain(|w| w.strong_count() > 0);
        hooks.push(Arc::downgrade(hook));
        drop(hooks);
        // Cancelled between the check and the push: `cancel` may have taken the list
        // before this hook was in it.
        if self.is_cancelled() {
            hook();
        }
    }

    /// The agent's answer to request `answer.id` arrived.
    pub fn deliver(&self, answer: RequestAnswer) {
        {
            let mut st = self.lock();
            if st.answers.len() >= MAX_HELD_ANSWERS && !st.answers.contains_key(&answer.id) {
                return;
            }
            st.answers.insert(answer.id, answer);
        }
        self.changed.notify_all();
    }

    /// Wait for the answer to `id` until `deadline`.
    pub fn wait_answer(&self, id: u64, deadline: Instant) -> Result<RequestAnswer, NoAnswer> {
        self.wait(id, deadline, None)
    }

    fn wait(
        &self,
        id: u64,
        deadline: Instant,
        epoch: Option<u64>,
    ) -> Result<RequestAnswer, NoAnswer> {
        let mut st = self.lock();
        loop {
            if st.cancelled {
                return Err(NoAnswer::Cancelled);
            }
            if epoch.is_some_and(|e| e != st.waits_epoch) {
                st.answers.remove(&id);
                return Err(NoAnswer::Over);
            }
            if let Some(a) = st.answers.remove(&id) {
                return Ok(a);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NoAnswer::TimedOut);
            }
            st = self
                .changed
                .wait_timeout(st, left.min(Duration::from_secs(3600)))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// The current wait epoch (see [`CallLink::wait_answer_in`]).
    pub fn waits_epoch(&self) -> u64 {
        self.lock().waits_epoch
    }

    /// The upstream answered the request whose stream brought relayed requests: those
    /// still waiting for the agent are over, and their waiters wake with
    /// [`NoAnswer::Over`].
    pub fn end_waits(&self) {
        self.lock().waits_epoch += 1;
        self.changed.notify_all();
    }

    /// [`CallLink::wait_answer`] that also ends when the wait epoch moves past `epoch`.
    pub fn wait_answer_in(
        &self,
        id: u64,
        deadline: Instant,
        epoch: u64,
    ) -> Result<RequestAnswer, NoAnswer> {
        self.wait(id, deadline, Some(epoch))
    }

    pub fn set_upstream_id(&self, id: Option<String>) {
        self.lock().upstream_id = id;
    }

    pub fn upstream_id(&self) -> Option<String> {
        self.lock().upstream_id.clone()
    }

    pub(super) fn track(&self, socket: Weak<dyn ShutdownHandle>) {
        let cancelled = self.lock().cancelled;
        if cancelled {
            // Cancelled while connecting: this connection is not wanted either.
            if let Some(s) = socket.upgrade() {
                s.shutdown();
            }
            return;
        }
        let mut sockets = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        sockets.retain(|w| w.strong_count() > 0);
        sockets.push(socket);
    }
}

/// The calls of the worker that are running or queued, by the gateway's request id.
#[derive(Default)]
pub struct CallLinks {
    map: Mutex<HashMap<u64, Arc<CallLink>>>,
}

impl CallLinks {
    pub fn insert(&self, link: Arc<CallLink>) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(link.call, link);
    }

    pub fn remove(&self, call: u64) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&call);
    }

    pub fn get(&self, call: u64) -> Option<Arc<CallLink>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&call)
            .cloned()
    }
}

thread_local! {
    /// The call the current thread's HTTP requests belong to.
    static CURRENT: RefCell<Option<Arc<CallLink>>> = const { RefCell::new(None) };
}

/// The call the current thread serves, if any.
pub(super) fn current_link() -> Option<Arc<CallLink>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// While alive, the requests this thread sends belong to `link`.
pub struct Serving(());

impl Serving {
    pub fn start(link: &Arc<CallLink>) -> Serving {
        CURRENT.with(|c| *c.borrow_mut() = Some(Arc::clone(link)));
        Serving(())
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        CURRENT.with(|c| *c.borrow_mut() = None);
    }
}

/// ureq's default connector, its connections bound to the call of the thread that uses
/// them (see `call_connections.rs`): a cancelled call shuts down the socket its request is
/// on, whether the connection is new or reused from the pool.
#[derive(Debug, Default)]
pub struct TrackingConnector {
    inner: DefaultConnector,
}

type Register = dyn Fn(Weak<dyn ShutdownHandle>) -> Result<(), ureq::Error> + Send + Sync + 'static;

impl Connector<()> for TrackingConnector {
    type Out = Box<dyn Transport>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<()>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        let pool = Arc::clone(&details.register_shutdown);
        let socket: Arc<Mutex<Option<Weak<dyn ShutdownHandle>>>> = Arc::new(Mutex::new(None));
        let seen = Arc::clone(&socket);
        let register: Arc<Register> = Arc::new(move |handle: Weak<dyn ShutdownHandle>| {
            *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle.clone());
            pool(handle)
        });
        let tracked = ConnectionDetails {
            uri: details.uri,
            addrs: details.addrs.clone(),
            config: details.config,
            request_level: details.request_level,
            resolver: details.resolver,
            now: details.now,
            timeout: details.timeout,
            current_time: Arc::clone(&details.current_time),
            run_connector: Arc::clone(&details.run_connector),
            register_shutdown: register,
        };
        let Some(transport) = self.inner.connect(&tracked, chained)? else {
            return Ok(None);
        };
        let socket = socket.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok(Some(Box::new(CallBoundTransport::new(transport, socket))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_wait_and_cancel_wakes() {
        let link = CallLink::new(7);
        link.deliver(RequestAnswer::result(1, serde_json::json!({"ok": true})));
        let a = link
            .wait_answer(1, Instant::now() + Duration::from_secs(5))
            .unwrap();
        assert_eq!(a.id, 1);
        assert_eq!(
            link.wait_answer(2, Instant::now()).unwrap_err(),
            NoAnswer::TimedOut
        );
        let l2 = Arc::clone(&link);
        let waiter = std::thread::spawn(move || {
            l2.wait_answer(3, Instant::now() + Duration::from_secs(600))
        });
        std::thread::sleep(Duration::from_millis(20));
        link.cancel();
        assert_eq!(waiter.join().unwrap().unwrap_err(), NoAnswer::Cancelled);
    }

    #[test]
    fn held_answers_are_bounded() {
        let link = CallLink::new(1);
        for id in 0..(MAX_HELD_ANSWERS as u64 + 10) {
            link.deliver(RequestAnswer::result(id, serde_json::Value::Null));
        }
        assert_eq!(link.lock().answers.len(), MAX_HELD_ANSWERS);
    }
}
