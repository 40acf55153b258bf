//! A daemon under test as a child process: started, its stderr collected, ready once it
//! polls a [`FakeTelegram`] (or sets its webhook there), and stopped with SIGKILL. The
//! command line is the test's: this crate knows no parlor binary.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tokio::sync::Notify;

use crate::FakeTelegram;

/// A running child process and the lines it wrote to stderr so far.
#[derive(Debug)]
pub struct DaemonProcess {
    /// The process (spawned with `kill_on_drop`).
    pub child: Child,
    log: Arc<Mutex<String>>,
    /// Woken at every line added to `log`.
    logged: Arc<Notify>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl DaemonProcess {
    /// Spawns `command` (stderr piped and collected, stdout discarded) and waits until it
    /// calls `getUpdates` on `telegram` once more than before.
    ///
    /// # Panics
    /// If it cannot be spawned or does not poll within `wait` (with its log).
    pub async fn spawn_polling(command: Command, telegram: &FakeTelegram, wait: Duration) -> Self {
        let calls_before = telegram.calls("getUpdates");
        let daemon = Self::spawn(command);
        if let Err(e) = telegram
            .wait_for_calls("getUpdates", calls_before + 1, wait)
            .await
        {
            panic!("the daemon never polled: {e}\n{}", daemon.log());
        }
        daemon
    }

    /// Spawns `command` like [`DaemonProcess::spawn_polling`] and waits until it calls
    /// `setWebhook` on `telegram` once more than before and Telegram holds a webhook.
    ///
    /// # Panics
    /// If it cannot be spawned or sets no webhook within `wait` (with its log).
    pub async fn spawn_webhook(command: Command, telegram: &FakeTelegram, wait: Duration) -> Self {
        let calls_before = telegram.calls("setWebhook");
        let daemon = Self::spawn(command);
        if let Err(e) = telegram
            .wait_for_calls("setWebhook", calls_before + 1, wait)
            .await
        {
            panic!("the daemon never set its webhook: {e}\n{}", daemon.log());
        }
        if let Err(e) = telegram.wait_for_webhook(wait).await {
            panic!("Telegram holds no webhook: {e}\n{}", daemon.log());
        }
        daemon
    }

    /// Spawns `command` with stderr piped and collected, stdout discarded.
    ///
    /// # Panics
    /// If it cannot be spawned.
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn the daemon: {e}"));
        let log = Arc::new(Mutex::new(String::new()));
        let logged = Arc::new(Notify::new());
        let mut reader = None;
        if let Some(stderr) = child.stderr.take() {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            let sink = Arc::clone(&log);
            let wake = Arc::clone(&logged);
            reader = Some(tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    {
                        let mut log = sink.lock().unwrap_or_else(|p| p.into_inner());
                        log.push_str(&line);
                        log.push('\n');
                    }
                    wake.notify_waiters();
                }
            }));
        }
        Self {
            child,
            log,
            logged,
            reader,
        }
    }

    /// Everything it wrote to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until its log contains `needle`, for at most `wait`; the log so far.
    ///
    /// # Panics
    /// If it does not within `wait` (with its log).
    pub async fn wait_for_log(&self, needle: &str, wait: Duration) -> String {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.logged.notified();
            tokio::pin!(notified);
            // Registered before looking, so a line logged in between still wakes us.
            notified.as_mut().enable();
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("no {needle:?} in the log within {wait:?}:\n{log}");
            }
        }
    }

    /// SIGTERM, then waits (at most `wait`) for it to exit and for its last stderr lines;
    /// returns how it exited.
    ///
    /// # Panics
    /// If the signal cannot be sent or it does not exit within `wait` (with its log).
    pub async fn terminate(&mut self, wait: Duration) -> std::process::ExitStatus {
        let Some(pid) = self.child.id() else {
            panic!("the daemon has already exited\n{}", self.log());
        };
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        assert!(sent.is_ok_and(|s| s.success()), "cannot send SIGTERM");
        let exit = match tokio::time::timeout(wait, self.child.wait()).await {
            Ok(Ok(exit)) => exit,
            Ok(Err(e)) => panic!("cannot wait for the daemon: {e}"),
            Err(_) => panic!("the daemon did not stop after SIGTERM\n{}", self.log()),
        };
        // Its stderr ends with it: the reader finishes once it has the last line.
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(wait, reader).await;
        }
        exit
    }

    /// SIGKILL, and waits for it to be gone: no cleanup at all.
    ///
    /// # Panics
    /// If the signal cannot be sent.
    pub async fn kill9(&mut self) {
        if let Err(e) = self.child.kill().await {
            panic!("cannot kill the daemon: {e}");
        }
    }
}
