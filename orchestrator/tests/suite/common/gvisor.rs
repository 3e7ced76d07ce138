//! The runsc-enabled Docker engine of the gVisor tests (`gvisor.rs`, `gvisor_root.rs`): started
//! beside the host's by `scripts/lib/gvisor_engine.sh`, one at a time in this binary, stopped
//! (nothing left) when dropped.

use std::process::Command;

use dispatcher::Isolation;
use orchestrator::config::NodeConfig;

use super::sandbox::AgentSandbox;
use super::{test_config, TestDb};

/// A test node on `db` whose sandboxes are of class `class` on the engine at `host` (`None`:
/// the host's); see [`place_sandboxes`].
pub fn node_config(db: &TestDb, host: Option<&str>, class: Isolation) -> NodeConfig {
    let mut config = test_config(&db.url);
    place_sandboxes(&mut config, host, class);
    config
}

/// Makes `config` place its sandboxes, of class `class`, on the engine at `host` (`None`: the
/// host's). Landlock is not required: gVisor's kernel has none, and commands run there under
/// gVisor's boundary, the executor's path rules and the argv policy (ARCHITECTURE.md, "The
/// gVisor class").
pub fn place_sandboxes(config: &mut NodeConfig, host: Option<&str>, class: Isolation) {
    config.docker.host = host.map(str::to_owned);
    config.sandbox.isolation = class;
    config.sandbox.require_landlock = false;
}

/// Where a runsc-enabled engine lives (`scripts/lib/second_engine.sh` with
/// `AEGIS_ENGINE2_RUNSC=1`): its directories, bridge, address range and firewall tag, whether
/// it has the engine's experimental features (checkpoints), and the lock that keeps it to one
/// test at a time in this binary (a test's stop would pull it from under another). Places with
/// other names run beside each other.
pub struct Place {
    pub dir: &'static str,
    pub run: &'static str,
    pub bridge: &'static str,
    pub range: &'static str,
    pub tag: &'static str,
    pub experimental: bool,
    pub alone: &'static std::sync::Mutex<()>,
}

static DEFAULT_ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The engine of `scripts/lib/gvisor_engine.sh`'s defaults.
pub const DEFAULT: Place = Place {
    dir: "/var/lib/aegis-gvisor",
    run: "/run/aegis-gvisor",
    bridge: "aegis-gvisor",
    range: "10.214.0.0/16",
    tag: "aegis-gvisor",
    experimental: true,
    alone: &DEFAULT_ALONE,
};

impl Place {
    fn script(&self, verb: &str, images: &[&str]) -> std::process::Output {
        Command::new("bash")
            .arg(format!(
                "{}/../scripts/lib/second_engine.sh",
                env!("CARGO_MANIFEST_DIR")
            ))
            .arg(verb)
            .args(images)
            .env("AEGIS_ENGINE2_DIR", self.dir)
            .env("AEGIS_ENGINE2_RUN", self.run)
            .env("AEGIS_ENGINE2_BRIDGE", self.bridge)
            .env("AEGIS_ENGINE2_RANGE", self.range)
            .env("AEGIS_ENGINE2_TAG", self.tag)
            .env("AEGIS_ENGINE2_RUNSC", "1")
            .env("AEGIS_ENGINE2_EXPERIMENTAL", self.experimental.to_string())
            .output()
            .expect("bash runs")
    }
}

/// The runsc-enabled engine, stopped (nothing left) when dropped.
pub struct GvisorEngine {
    /// The engine's address (`unix://...`), for `docker.host`.
    pub host: String,
    /// Where it lives.
    pub place: &'static Place,
    _alone: std::sync::MutexGuard<'static, ()>,
}

impl GvisorEngine {
    /// A test node on `db` whose sandboxes are of the gVisor class on this engine.
    pub fn node(&self, db: &TestDb) -> NodeConfig {
        node_config(db, Some(&self.host), Isolation::Gvisor)
    }

    /// Starts the default engine with the `busybox` runtime image loaded.
    pub fn start() -> GvisorEngine {
        Self::start_with(&["aegis-runtime/busybox:1"])
    }

    /// Starts the default engine with `images` loaded from the host's engine.
    pub fn start_with(images: &[&str]) -> GvisorEngine {
        Self::start_at(&DEFAULT, images)
    }

    /// Starts the engine at `place` with `images` loaded from the host's engine.
    pub fn start_at(place: &'static Place, images: &[&str]) -> GvisorEngine {
        let alone = place
            .alone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = place.script("start", images);
        assert!(
            out.status.success(),
            "the gVisor engine must start here (scripts/lib/second_engine.sh; scripts/test.sh \
             installs runsc):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let host = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(host.starts_with("unix://"), "its address: {host}");
        GvisorEngine {
            host,
            place,
            _alone: alone,
        }
    }

    /// `docker -H <engine> args...`: (exit code, stdout).
    pub fn docker(&self, args: &[&str]) -> (i32, String) {
        let out = super::docker_on(&self.host, args);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
    }

    /// Names of the engine's containers (any state) whose name contains `part`, each with its
    /// state.
    pub fn containers(&self, part: &str) -> Vec<String> {
        let (_, out) = self.docker(&["ps", "-a", "--format", "{{.Names}} {{.State}}"]);
        out.lines()
            .filter(|l| l.contains(part))
            .map(str::to_owned)
            .collect()
    }

    /// Runs `argv` in `sandbox` as the sandbox user with `docker exec` (what agent code could
    /// do): (exit code, stdout).
    pub fn inside(&self, sandbox: &AgentSandbox, argv: &[&str]) -> (i32, String) {
        let container = sandbox.container();
        let mut args = vec!["exec", "-u", "65534:65534", container.as_str()];
        args.extend_from_slice(argv);
        self.docker(&args)
    }
}

impl Drop for GvisorEngine {
    fn drop(&mut self) {
        let out = self.place.script("stop", &[]);
        if !out.status.success() {
            eprintln!(
                "the gVisor engine did not stop cleanly:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
