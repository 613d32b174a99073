//! Harness for end-to-end tests: runs the real `lethe` binary as a child process, on free ports,
//! against a real state store, and waits for it with a deadline instead of sleeping.

#![forbid(unsafe_code)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use lethe::cli::control_api::call;
pub use lethe::testing::{execute_raw, fresh_postgres_database, fresh_sqlite_url};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `lethe` binary: `LETHE_BIN`, else the workspace's debug build, brought up to date once per
/// test process (a no-op when nothing changed) so that a test never runs a stale binary.
pub fn lethe_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Ok(path) = std::env::var("LETHE_BIN") {
                return PathBuf::from(path);
            }
            let status = Command::new(env!("CARGO"))
                // The features a workspace build gives the binary's crate (this crate turns on `testing`):
                // building with others would replace the binary under tests already running it.
                .args([
                    "build",
                    "-q",
                    "-p",
                    "lethe",
                    "--features",
                    "testing",
                    "--bin",
                    "lethe",
                ])
                .current_dir(workspace())
                .status()
                .expect("run cargo build");
            assert!(status.success(), "building lethe failed");
            workspace().join("target/debug/lethe")
        })
        .clone()
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("find a free port")
}

/// A `lethe` command run in `dir` (an empty folder unless the test puts a config there), with no
/// Lethe variables inherited: key material is generated and kept in the state store, as on a
/// fresh machine.
pub fn lethe(dir: &Path) -> Command {
    let mut command = Command::new(lethe_binary());
    command
        .current_dir(dir)
        .env_remove("LETHE_CONFIG")
        .env_remove("LETHE_STATE_URL")
        .env_remove("LETHE_CONTROL_LISTEN")
        .env_remove("LETHE_DATA_LISTEN")
        .env_remove("LETHE_ADMIN_LISTEN")
        .env_remove("LETHE_JWT_SECRET")
        .env_remove("LETHE_AUDIT_KEY")
        .env_remove("LETHE_TOKEN")
        .env_remove("LETHE_CONTROL_URL")
        // No Chroma in these tests: forwarded requests meet a closed port (502 upstream_unavailable).
        .env("LETHE_UPSTREAM_CHROMA", "http://127.0.0.1:9")
        .env("LETHE_LOG", "warn");
    command
}

pub fn run(command: &mut Command) -> Output {
    command.output().expect("run lethe")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A fresh, empty working folder.
pub fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lethe-e2e-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("create a temp folder");
    dir
}

/// A running `lethe serve`, stopped when dropped.
pub struct Server {
    child: Child,
    pub control: SocketAddr,
    pub data: SocketAddr,
    pub admin: SocketAddr,
    pub dir: PathBuf,
    pub state_url: String,
}

impl Server {
    /// Starts `lethe serve` in `dir` with the given state store and waits until `/readyz` says
    /// ready (at most 20 s). Free ports are picked, then bound by the child; if another test
    /// process took one in between, the start is tried again with new ports.
    pub async fn start(dir: &Path, state_url: &str) -> Server {
        Self::start_with(dir, state_url, |_| {}).await
    }

    /// [`Server::start`], the command first changed by `change` (its environment, where its
    /// output goes).
    pub async fn start_with(dir: &Path, state_url: &str, change: impl Fn(&mut Command)) -> Server {
        // A shared store's schema is `lethe migrate`'s to change, as in a deployment.
        if state_url.starts_with("postgres") {
            let migrated = run(lethe(dir).args(["migrate", "--state", state_url]));
            assert!(
                migrated.status.success(),
                "lethe migrate: {}",
                stderr(&migrated)
            );
        }
        for _ in 0..3 {
            if let Some(server) = Self::try_start(dir, state_url, &change).await {
                return server;
            }
        }
        panic!("lethe serve did not start in three tries");
    }

    async fn try_start(
        dir: &Path,
        state_url: &str,
        change: &impl Fn(&mut Command),
    ) -> Option<Server> {
        let control: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("address");
        let data: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("address");
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("address");
        let mut command = lethe(dir);
        command.stderr(Stdio::inherit());
        change(&mut command);
        let child = command
            .args(["serve", "--state", state_url])
            .args([
                "--control-listen",
                &control.to_string(),
                "--data-listen",
                &data.to_string(),
                "--admin-listen",
                &admin.to_string(),
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("start lethe serve");
        let mut server = Server {
            child,
            control,
            data,
            admin,
            dir: dir.to_owned(),
            state_url: state_url.to_owned(),
        };
        server
            .wait_ready(Duration::from_secs(20))
            .await
            .then_some(server)
    }

    /// Whether the server became ready; false when it exited first.
    async fn wait_ready(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok((status, _)) = call(hyper::Method::GET, &self.url("/readyz"), "", None).await
                && status.is_success()
            {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "lethe serve not ready within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.control)
    }

    /// A token minted by the binary itself (`lethe token`) for this server's state store.
    pub fn token(&self, role: &str, tenant: &str) -> String {
        self.token_for(role, tenant, None)
    }

    /// The same, bound to one data subject when `subject` is given.
    pub fn token_for(&self, role: &str, tenant: &str, subject: Option<&str>) -> String {
        let mut command = lethe(&self.dir);
        command.args([
            "token",
            "--role",
            role,
            "--tenant",
            tenant,
            "--state",
            &self.state_url,
        ]);
        if let Some(subject) = subject {
            command.args(["--subject", subject]);
        }
        let output = run(&mut command);
        assert!(output.status.success(), "lethe token: {}", stderr(&output));
        stdout(&output).trim().to_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
