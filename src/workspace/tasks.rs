//! The task table, sans-IO: every command runs as a task; calls wait on tasks; timers end
//! waits, cancel tasks that run too long, escalate SIGTERM to SIGKILL and drop finished
//! tasks after their retention. The worker's loop feeds it output, exits and the clock,
//! and carries out the actions it returns (signal a task, answer a call, record an end).

use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::error::{WsError, WsErrorCode, ok_result};
use super::output::CappedOutput;

/// After a task's shell exits, how long its output pipes may take to close (every process
/// of the task is gone by then, so they close at once unless something is badly wrong).
pub const DRAIN: Duration = Duration::from_secs(2);
/// How long `task_cancel` waits beyond the grace period for the task to be gone.
pub const CANCEL_SLACK: Duration = Duration::from_secs(3);
/// Characters of a command shown in `task_list` and ledger events.
const COMMAND_SUMMARY_CHARS: usize = 200;

/// What the next actions of a still-running task are, as the agent is told.
pub const NEXT_ACTIONS: [&str; 3] = ["check_later", "wait_longer", "cancel"];

#[derive(Debug, Clone)]
pub struct TaskLimits {
    pub max_tasks: usize,
    pub output_cap_bytes: usize,
    pub retention: Duration,
    pub max_runtime: Duration,
    pub cancel_grace: Duration,
    pub preview_bytes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// How a task's shell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// Its leader vanished without a status (killed from outside the worker).
    Lost,
}

impl Exit {
    /// From a `waitpid` status.
    pub fn from_wait_status(status: i32) -> Exit {
        if libc::WIFEXITED(status) {
            Exit::Code(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Exit::Signal(libc::WTERMSIG(status))
        } else {
            Exit::Lost
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    Running,
    Completed,
    Failed,
    Cancelled,
    TimedOut,
}

impl TaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Running => "running",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
            TaskStatus::TimedOut => "timed_out",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CancelCause {
    Requested,
    RuntimeLimit,
}

#[derive(Debug, Clone, Copy)]
struct Cancel {
    cause: CancelCause,
    kill_at: Instant,
    killed: bool,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Running,
    /// The shell exited; output pipes are closing.
    Ending {
        exit: Exit,
        at: Instant,
    },
    Done {
        status: TaskStatus,
        exit: Exit,
        ended: Instant,
    },
}

#[derive(Debug)]
struct Task {
    id: String,
    command: String,
    started: Instant,
    started_ms: u64,
    /// The shell's pid, which is also its process group.
    pid: Option<i32>,
    stdout: CappedOutput,
    stderr: CappedOutput,
    open_streams: [bool; 2],
    phase: Phase,
    cancel: Option<Cancel>,
    runtime_deadline: Instant,
}

/// Why a call waits on a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitKind {
    /// `shell_run`: the result, or at the soft timeout a running status.
    ShellRun,
    /// `task_wait`.
    TaskWait,
    /// `task_cancel`: the final result once the task is gone.
    Cancel,
}

#[derive(Debug)]
struct Waiter {
    rpc: u64,
    task: String,
    deadline: Instant,
    kind: WaitKind,
}

/// What the loop must do.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskAction {
    /// SIGTERM to every process of the task.
    Terminate { task: String },
    /// SIGKILL to every process of the task.
    Kill { task: String },
    /// Answer a call with this `CallToolResult`.
    Reply { rpc: u64, result: Value },
    /// The task ended: release its pipes, record the summary.
    Finished { task: String, summary: Value },
}

#[derive(Debug)]
pub struct Tasks {
    limits: TaskLimits,
    tasks: HashMap<String, Task>,
    waiters: Vec<Waiter>,
    actions: Vec<TaskAction>,
}

fn elapsed_ms(from: Instant, to: Instant) -> u64 {
    to.saturating_duration_since(from).as_millis() as u64
}

fn summary_of(command: &str) -> String {
    let mut s: String = command.chars().take(COMMAND_SUMMARY_CHARS).collect();
    if s.len() < command.len() {
        s.push('…');
    }
    s
}

impl Tasks {
    pub fn new(limits: TaskLimits) -> Tasks {
        Tasks {
            limits,
            tasks: HashMap::new(),
            waiters: Vec::new(),
            actions: Vec::new(),
        }
    }

    pub fn limits(&self) -> &TaskLimits {
        &self.limits
    }

    pub fn take_actions(&mut self) -> Vec<TaskAction> {
        std::mem::take(&mut self.actions)
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Makes room for one more task: drops expired ones, then the oldest finished one when
    /// the table is full. `too_many_tasks` when every slot holds a running task.
    pub fn admit(&mut self, now: Instant) -> Result<(), WsError> {
        self.expire(now);
        if self.tasks.len() < self.limits.max_tasks {
            return Ok(());
        }
        let oldest_done = self
            .tasks
            .values()
            .filter_map(|t| match t.phase {
                Phase::Done { ended, .. } => Some((ended, t.id.clone())),
                _ => None,
            })
            .min();
        match oldest_done {
            Some((_, id)) => {
                self.tasks.remove(&id);
                Ok(())
            }
            None => Err(WsError::new(
                WsErrorCode::TooManyTasks,
                format!(
                    "{} tasks are running (max_tasks); wait for one or cancel one (ws__task_list)",
                    self.tasks.len()
                ),
            )),
        }
    }

    /// A task that just started. `runtime` is its hard limit (capped by the configured one).
    pub fn insert(
        &mut self,
        id: String,
        command: String,
        now: Instant,
        now_ms: u64,
        runtime: Option<Duration>,
    ) {
        let runtime = runtime
            .filter(|d| !d.is_zero())
            .map_or(self.limits.max_runtime, |d| d.min(self.limits.max_runtime));
        // Split the cap between the two streams.
        let half = self.limits.output_cap_bytes / 2;
        let task = Task {
            id: id.clone(),
            command,
            started: now,
            started_ms: now_ms,
            pid: None,
            stdout: CappedOutput::new(self.limits.output_cap_bytes - half),
            stderr: CappedOutput::new(half),
            open_streams: [true, true],
            phase: Phase::Running,
            cancel: None,
            runtime_deadline: now + runtime,
        };
        self.tasks.insert(id, task);
    }

    pub fn set_pid(&mut self, id: &str, pid: i32) {
        if let Some(t) = self.tasks.get_mut(id) {
            t.pid = Some(pid);
        }
    }

    pub fn pid(&self, id: &str) -> Option<i32> {
        self.tasks.get(id).and_then(|t| t.pid)
    }

    pub fn on_output(&mut self, id: &str, stream: Stream, bytes: &[u8]) {
        if let Some(t) = self.tasks.get_mut(id) {
            match stream {
                Stream::Stdout => t.stdout.push(bytes),
                Stream::Stderr => t.stderr.push(bytes),
            }
        }
    }

    pub fn on_stream_closed(&mut self, id: &str, stream: Stream, now: Instant) {
        if let Some(t) = self.tasks.get_mut(id) {
            t.open_streams[stream as usize] = false;
        }
        self.maybe_finish(id, now);
    }

    pub fn on_exit(&mut self, id: &str, exit: Exit, now: Instant) {
        if let Some(t) = self.tasks.get_mut(id)
            && matches!(t.phase, Phase::Running)
        {
            t.phase = Phase::Ending { exit, at: now };
        }
        self.maybe_finish(id, now);
    }

    fn maybe_finish(&mut self, id: &str, now: Instant) {
        let Some(t) = self.tasks.get_mut(id) else {
            return;
        };
        let Phase::Ending { exit, at } = t.phase else {
            return;
        };
        if t.open_streams.iter().any(|o| *o) && now < at + DRAIN {
            return;
        }
        let status = match (t.cancel.map(|c| c.cause), exit) {
            (Some(CancelCause::Requested), _) => TaskStatus::Cancelled,
            (Some(CancelCause::RuntimeLimit), _) => TaskStatus::TimedOut,
            (None, Exit::Code(0)) => TaskStatus::Completed,
            (None, _) => TaskStatus::Failed,
        };
        t.phase = Phase::Done {
            status,
            exit,
            ended: now,
        };
        let summary = json!({
            "task_id": t.id,
            "command": summary_of(&t.command),
            "status": status.as_str(),
            "exit_code": exit_code(exit),
            "signal": signal(exit),
            "duration_ms": elapsed_ms(t.started, now),
            "stdout_bytes": t.stdout.total(),
            "stderr_bytes": t.stderr.total(),
        });
        self.actions.push(TaskAction::Finished {
            task: id.to_owned(),
            summary,
        });
        let result = ok_result(self.full_view(id, now));
        let mut i = 0;
        while i < self.waiters.len() {
            if self.waiters[i].task == id {
                let w = self.waiters.swap_remove(i);
                self.actions.push(TaskAction::Reply {
                    rpc: w.rpc,
                    result: result.clone(),
                });
            } else {
                i += 1;
            }
        }
    }

    fn get_task(&self, id: &str) -> Result<&Task, WsError> {
        self.tasks.get(id).ok_or_else(|| {
            WsError::new(
                WsErrorCode::TaskNotFound,
                format!(
                    "no task {id:?} in this workspace (finished tasks are kept for a while; ws__task_list lists them)"
                ),
            )
        })
    }

    /// A call that waits for the task: answered at once when it is finished, else when it
    /// finishes or at `timeout` (then with its running status).
    pub fn wait(
        &mut self,
        rpc: u64,
        id: &str,
        timeout: Duration,
        kind: WaitKind,
        now: Instant,
    ) -> Result<(), WsError> {
        let task = self.get_task(id)?;
        if matches!(task.phase, Phase::Done { .. }) {
            let result = ok_result(self.full_view(id, now));
            self.actions.push(TaskAction::Reply { rpc, result });
            return Ok(());
        }
        if timeout.is_zero() && kind != WaitKind::Cancel {
            let result = ok_result(self.running_view(id, now, kind));
            self.actions.push(TaskAction::Reply { rpc, result });
            return Ok(());
        }
        self.waiters.push(Waiter {
            rpc,
            task: id.to_owned(),
            deadline: now + timeout,
            kind,
        });
        Ok(())
    }

    /// `task_cancel`: SIGTERM now, SIGKILL after the grace period; the call is answered
    /// once the task is gone (or with its state if that takes too long).
    pub fn cancel(&mut self, rpc: u64, id: &str, now: Instant) -> Result<(), WsError> {
        self.get_task(id)?;
        self.request_cancel(id, CancelCause::Requested, now);
        let wait = self.limits.cancel_grace + CANCEL_SLACK;
        self.wait(rpc, id, wait, WaitKind::Cancel, now)
    }

    fn request_cancel(&mut self, id: &str, cause: CancelCause, now: Instant) {
        let grace = self.limits.cancel_grace;
        let Some(t) = self.tasks.get_mut(id) else {
            return;
        };
        if !matches!(t.phase, Phase::Running) || t.cancel.is_some() {
            return;
        }
        t.cancel = Some(Cancel {
            cause,
            kill_at: now + grace,
            killed: false,
        });
        self.actions.push(TaskAction::Terminate {
            task: id.to_owned(),
        });
    }

    /// A call was cancelled by the client: stop waiting for it (the task goes on).
    pub fn forget(&mut self, rpc: u64) {
        self.waiters.retain(|w| w.rpc != rpc);
    }

    /// Everything due at `now`.
    pub fn on_timer(&mut self, now: Instant) {
        let ids: Vec<String> = self.tasks.keys().cloned().collect();
        for id in &ids {
            let Some(t) = self.tasks.get_mut(id) else {
                continue;
            };
            match t.phase {
                Phase::Running => {
                    if let Some(c) = &mut t.cancel {
                        if !c.killed && now >= c.kill_at {
                            c.killed = true;
                            self.actions.push(TaskAction::Kill { task: id.clone() });
                        }
                    } else if now >= t.runtime_deadline {
                        self.request_cancel(id, CancelCause::RuntimeLimit, now);
                    }
                }
                Phase::Ending { .. } => self.maybe_finish(id, now),
                Phase::Done { .. } => {}
            }
        }
        let mut i = 0;
        while i < self.waiters.len() {
            if self.waiters[i].deadline <= now {
                let w = self.waiters.swap_remove(i);
                let result = ok_result(self.running_view(&w.task, now, w.kind));
                self.actions.push(TaskAction::Reply { rpc: w.rpc, result });
            } else {
                i += 1;
            }
        }
        self.expire(now);
    }

    fn expire(&mut self, now: Instant) {
        let retention = self.limits.retention;
        self.tasks.retain(|_, t| match t.phase {
            Phase::Done { ended, .. } => now < ended + retention,
            _ => true,
        });
    }

    /// The earliest time [`Tasks::on_timer`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let tasks = self.tasks.values().filter_map(|t| match t.phase {
            Phase::Running => match t.cancel {
                Some(c) if !c.killed => Some(c.kill_at),
                // Killed: nothing is left to do but wait for the exit.
                Some(_) => None,
                None => Some(t.runtime_deadline),
            },
            Phase::Ending { at, .. } => Some(at + DRAIN),
            Phase::Done { ended, .. } => Some(ended + self.limits.retention),
        });
        let waiters = self.waiters.iter().map(|w| w.deadline);
        tasks.chain(waiters).min()
    }

    /// Ids of tasks whose processes may still run.
    pub fn live(&self) -> Vec<String> {
        self.tasks
            .values()
            .filter(|t| !matches!(t.phase, Phase::Done { .. }))
            .map(|t| t.id.clone())
            .collect()
    }

    pub fn status(&self, id: &str) -> Option<TaskStatus> {
        self.tasks.get(id).map(|t| match t.phase {
            Phase::Done { status, .. } => status,
            _ => TaskStatus::Running,
        })
    }

    /// `task_get`: the full state, output so far included.
    pub fn get(&self, id: &str, now: Instant) -> Result<Value, WsError> {
        self.get_task(id)?;
        Ok(self.full_view(id, now))
    }

    /// `task_list`: every task held, newest first.
    pub fn list(&self, now: Instant) -> Value {
        let mut tasks: Vec<&Task> = self.tasks.values().collect();
        tasks.sort_by(|a, b| b.started.cmp(&a.started).then(a.id.cmp(&b.id)));
        let items: Vec<Value> = tasks
            .iter()
            .map(|t| {
                let (status, exit, end) = match t.phase {
                    Phase::Done {
                        status,
                        exit,
                        ended,
                    } => (status, Some(exit), ended),
                    _ => (TaskStatus::Running, None, now),
                };
                json!({
                    "task_id": t.id,
                    "command": summary_of(&t.command),
                    "status": status.as_str(),
                    "exit_code": exit.and_then(exit_code),
                    "started_at_ms": t.started_ms,
                    "duration_ms": elapsed_ms(t.started, end),
                })
            })
            .collect();
        json!({ "tasks": items, "max_tasks": self.limits.max_tasks })
    }

    fn full_view(&self, id: &str, now: Instant) -> Value {
        let Some(t) = self.tasks.get(id) else {
            return json!({ "task_id": id, "status": "unknown" });
        };
        let (status, exit, end) = match t.phase {
            Phase::Done {
                status,
                exit,
                ended,
            } => (status, Some(exit), ended),
            _ => (TaskStatus::Running, None, now),
        };
        let mut v = json!({
            "task_id": t.id,
            "command": t.command,
            "status": status.as_str(),
            "exit_code": exit.and_then(exit_code),
            "stdout": t.stdout.render(),
            "stderr": t.stderr.render(),
            "truncated": t.stdout.truncated() || t.stderr.truncated(),
            "stdout_bytes": t.stdout.total(),
            "stderr_bytes": t.stderr.total(),
            "duration_ms": elapsed_ms(t.started, end),
            "started_at_ms": t.started_ms,
            "pid": t.pid,
        });
        if let Some(sig) = exit.and_then(signal) {
            v["signal"] = json!(sig);
        }
        if status == TaskStatus::Running {
            v["hint"] = json!(running_hint(&t.id));
            v["next_actions"] = json!(NEXT_ACTIONS);
        }
        v
    }

    fn running_view(&self, id: &str, now: Instant, kind: WaitKind) -> Value {
        let Some(t) = self.tasks.get(id) else {
            return json!({ "task_id": id, "status": "unknown" });
        };
        if matches!(t.phase, Phase::Done { .. }) {
            return self.full_view(id, now);
        }
        let n = self.limits.preview_bytes;
        let mut preview = t.stdout.last(n);
        let err = t.stderr.last(n / 2);
        if !err.is_empty() {
            preview.push_str("\n[stderr]\n");
            preview.push_str(&err);
        }
        let hint = if kind == WaitKind::Cancel {
            format!(
                "Task {} was asked to stop (SIGTERM, then SIGKILL) and has not ended yet. Check it with ws__task_get.",
                t.id
            )
        } else {
            running_hint(&t.id)
        };
        json!({
            "status": "running",
            "task_id": t.id,
            "pid": t.pid,
            "elapsed_ms": elapsed_ms(t.started, now),
            "preview": preview,
            "hint": hint,
            "next_actions": NEXT_ACTIONS,
        })
    }
}

fn running_hint(id: &str) -> String {
    format!(
        "Task {id} is still running. Use ws__task_wait to wait for it, ws__task_get to check on it later, or ws__task_cancel to stop it."
    )
}

fn exit_code(exit: Exit) -> Option<i32> {
    match exit {
        Exit::Code(c) => Some(c),
        _ => None,
    }
}

fn signal(exit: Exit) -> Option<i32> {
    match exit {
        Exit::Signal(s) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> TaskLimits {
        TaskLimits {
            max_tasks: 2,
            output_cap_bytes: 64,
            retention: Duration::from_secs(60),
            max_runtime: Duration::from_secs(100),
            cancel_grace: Duration::from_secs(2),
            preview_bytes: 8,
        }
    }

    fn structured(action: &TaskAction) -> (u64, Value) {
        match action {
            TaskAction::Reply { rpc, result } => (*rpc, result["structuredContent"].clone()),
            other => panic!("not a reply: {other:?}"),
        }
    }

    fn end(tasks: &mut Tasks, id: &str, exit: Exit, now: Instant) {
        tasks.on_exit(id, exit, now);
        tasks.on_stream_closed(id, Stream::Stdout, now);
        tasks.on_stream_closed(id, Stream::Stderr, now);
    }

    #[test]
    fn a_quick_command_answers_its_waiter_with_the_result() {
        let t0 = Instant::now();
        let mut tasks = Tasks::new(limits());
        tasks.admit(t0).expect("room");
        tasks.insert("tsk_1".into(), "echo hi".into(), t0, 0, None);
        tasks
            .wait(7, "tsk_1", Duration::from_secs(30), WaitKind::ShellRun, t0)
            .expect("wait");
        tasks.on_output("tsk_1", Stream::Stdout, b"hi\n");
        tasks.on_exit("tsk_1", Exit::Code(0), t0);
        // Still draining: no answer until both pipes closed.
        assert!(tasks.take_actions().is_empty());
        tasks.on_stream_closed("tsk_1", Stream::Stdout, t0);
        tasks.on_stream_closed("tsk_1", Stream::Stderr, t0 + Duration::from_millis(5));
        let actions = tasks.take_actions();
        assert!(matches!(&actions[0], TaskAction::Finished { task, summary }
            if task == "tsk_1" && summary["status"] == "completed"));
        let (rpc, v) = structured(&actions[1]);
        assert_eq!(rpc, 7);
        assert_eq!(v["status"], "completed");
        assert_eq!(v["stdout"], "hi\n");
        assert_eq!(v["exit_code"], 0);
        assert_eq!(v["duration_ms"], 5);
        assert!(v.get("hint").is_none());
    }

    #[test]
    fn the_soft_timeout_answers_running_and_the_task_goes_on() {
        let t0 = Instant::now();
        let mut tasks = Tasks::new(limits());
        tasks.insert("tsk_1".into(), "sleep 100".into(), t0, 0, None);
        tasks
            .wait(1, "tsk_1", Duration::from_secs(30), WaitKind::ShellRun, t0)
            .expect("wait");
        tasks.on_output("tsk_1", Stream::Stdout, b"0123456789abc");
        assert_eq!(tasks.next_deadline(), Some(t0 + Duration::from_secs(30)));
        tasks.on_timer(t0 + Duration::from_secs(30));
        let actions = tasks.take_actions();
        assert_eq!(actions.len(), 1);
        let (_, v) = structured(&actions[0]);
        assert_eq!(v["status"], "running");
        assert_eq!(v["task_id"], "tsk_1");
        assert_eq!(v["preview"], "56789abc");
        assert_eq!(v["next_actions"], json!(NEXT_ACTIONS));
        assert!(
            v["hint"]
                .as_str()
                .is_some_and(|h| h.contains("ws__task_wait"))
        );
        assert_eq!(tasks.status("tsk_1"), Some(TaskStatus::Running));
        // A later wait gets the end.
        tasks
            .wait(2, "tsk_1", Duration::from_secs(10), WaitKind::TaskWait, t0)
            .expect("wait");
        end(
            &mut tasks,
            "tsk_1",
            Exit::Code(3),
            t0 + Duration::from_secs(31),
        );
        let actions = tasks.take_actions();
        let (rpc, v) = structured(&actions[1]);
        assert_eq!((rpc, v["status"].as_str()), (2, Some("failed")));
        assert_eq!(v["exit_code"], 3);
    }

    #[test]
    fn cancel_terms_then_kills_after_the_grace_and_reports_cancelled() {
        let t0 = Instant::now();
        let mut tasks = Tasks::new(limits());
        tasks.insert(
            "tsk_1".into(),
            "trap '' TERM; sleep 100".into(),
            t0,
            0,
            None,
        );
        tasks.cancel(9, "tsk_1", t0).expect("cancel");
        assert_eq!(
            tasks.take_actions(),
            vec![TaskAction::Terminate {
                task: "tsk_1".into()
            }]
        );
        // A second cancel does not signal again.
        tasks.cancel(10, "tsk_1", t0).expect("again");
        assert!(tasks.take_actions().is_empty());
        tasks.on_timer(t0 + Duration::from_secs(1));
        assert!(tasks.take_actions().is_empty());
        tasks.on_timer(t0 + Duration::from_secs(2));
        assert_eq!(
            tasks.take_actions(),
            vec![TaskAction::Kill {
                task: "tsk_1".into()
            }]
        );
        end(
            &mut tasks,
            "tsk_1",
            Exit::Signal(9),
            t0 + Duration::from_secs(2),
        );
        let actions = tasks.take_actions();
        assert_eq!(actions.len(), 3, "{actions:?}");
        for a in &actions[1..] {
            let (_, v) = structured(a);
            assert_eq!(v["status"], "cancelled");
            assert_eq!(v["signal"], 9);
            assert_eq!(v["exit_code"], Value::Null);
        }
    }

    #[test]
    fn the_runtime_limit_cancels_as_timed_out() {
        let t0 = Instant::now();
        let mut tasks = Tasks::new(limits());
        tasks.insert(
            "tsk_1".into(),
            "sleep 1000".into(),
            t0,
            0,
            Some(Duration::from_secs(5)),
        );
        assert_eq!(tasks.next_deadline(), Some(t0 + Duration::from_secs(5)));
        tasks.on_timer(t0 + Duration::from_secs(5));
        assert_eq!(
            tasks.take_actions(),
            vec![TaskAction::Terminate {
                task: "tsk_1".into()
            }]
        );
        end(
            &mut tasks,
            "tsk_1",
            Exit::Signal(15),
            t0 + Duration::from_secs(6),
        );
        assert_eq!(tasks.status("tsk_1"), Some(TaskStatus::TimedOut));
        // A runtime above the configured one is capped.
        tasks.insert(
            "tsk_2".into(),
            "x".into(),
            t0,
            0,
            Some(Duration::from_secs(500)),
        );
        tasks.on_timer(t0 + Duration::from_secs(100));
        assert!(tasks.take_actions().contains(&TaskAction::Terminate {
            task: "tsk_2".into()
        }));
    }

    #[test]
    fn the_table_is_bounded_finished_tasks_make_room_and_expire() {
        let t0 = Instant::now();
        let mut tasks = Tasks::new(limits());
        tasks.admit(t0).expect("1");
        tasks.insert("a".into(), "x".into(), t0, 0, None);
        tasks.admit(t0).expect("2");
        tasks.insert("b".into(), "x".into(), t0, 0, None);
        let e = tasks.admit(t0).expect_err("full of running tasks");
        assert_eq!(e.code, WsErrorCode::TooManyTasks);
        end(&mut tasks, "a", Exit::Code(0), t0);
        tasks.admit(t0).expect("a finished task makes room");
        assert_eq!(tasks.len(), 1);
        assert_eq!(
            tasks.get("a", t0).expect_err("evicted").code,
            WsErrorCode::TaskNotFound
        );
        end(&mut tasks, "b", Exit::Code(0), t0);
        assert!(tasks.get("b", t0 + Duration::from_secs(59)).is_ok());
        tasks.on_timer(t0 + Duration::from_secs(60));
        assert!(tasks.is_empty());
    }

    #[test]
    fn a_forgotten_waiter_gets_no_answer_and_unknown_tasks_are_refused() {
        let t0 = Instant::now();
        let mut tasks = Tasks::new(limits());
        tasks.insert("a".into(), "x".into(), t0, 0, None);
        tasks
            .wait(1, "a", Duration::from_secs(1), WaitKind::ShellRun, t0)
            .expect("wait");
        tasks.forget(1);
        tasks.on_timer(t0 + Duration::from_secs(2));
        end(&mut tasks, "a", Exit::Code(0), t0 + Duration::from_secs(2));
        let replies = tasks
            .take_actions()
            .into_iter()
            .filter(|a| matches!(a, TaskAction::Reply { .. }))
            .count();
        assert_eq!(replies, 0);
        for e in [
            tasks.wait(2, "zz", Duration::ZERO, WaitKind::TaskWait, t0),
            tasks.cancel(3, "zz", t0),
        ] {
            assert_eq!(e.expect_err("unknown").code, WsErrorCode::TaskNotFound);
        }
    }

    #[test]
    fn output_is_capped_per_task_and_pipes_left_open_stop_mattering_after_the_drain() {
        let t0 = Instant::now();
        let mut tasks = Tasks::new(limits());
        tasks.insert("a".into(), "yes".into(), t0, 0, None);
        for _ in 0..100 {
            tasks.on_output("a", Stream::Stdout, b"y\n");
            tasks.on_output("a", Stream::Stderr, b"e\n");
        }
        tasks.on_exit("a", Exit::Code(0), t0);
        tasks.on_timer(t0 + DRAIN);
        let v = tasks.get("a", t0 + DRAIN).expect("get");
        assert_eq!(v["status"], "completed");
        assert_eq!(v["truncated"], true);
        assert_eq!(v["stdout_bytes"], 200);
        let kept = v["stdout"].as_str().map(str::len).unwrap_or(0)
            + v["stderr"].as_str().map(str::len).unwrap_or(0);
        let markers = 2 * "\n[... 168 bytes omitted (output_cap_bytes) ...]\n".len();
        assert_eq!(kept, 64 + markers);
    }
}
