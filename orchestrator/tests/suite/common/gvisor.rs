//! The runsc-enabled Docker engine of the gVisor tests (`gvisor.rs`, `gvisor_root.rs`): started
//! beside the host's by `scripts/lib/gvisor_engine.sh`, one at a time in this binary, stopped
//! (nothing left) when dropped.

use std::process::Command;

use super::sandbox::AgentSandbox;

/// One gVisor engine at a time in this binary: a test's stop would pull it from under another.
static GVISOR_ENGINE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn script() -> String {
    format!(
        "{}/../scripts/lib/gvisor_engine.sh",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// The runsc-enabled engine, stopped (nothing left) when dropped.
pub struct GvisorEngine {
    /// The engine's address (`unix://...`), for `docker.host`.
    pub host: String,
    _alone: std::sync::MutexGuard<'static, ()>,
}

impl GvisorEngine {
    /// Starts the engine with the `busybox` runtime image loaded.
    pub fn start() -> GvisorEngine {
        Self::start_with(&["aegis-runtime/busybox:1"])
    }

    /// Starts the engine with `images` loaded from the host's engine.
    pub fn start_with(images: &[&str]) -> GvisorEngine {
        let alone = GVISOR_ENGINE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .args(images)
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "the gVisor engine must start here (scripts/lib/gvisor_engine.sh; scripts/test.sh \
             installs runsc):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let host = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(host.starts_with("unix://"), "its address: {host}");
        GvisorEngine {
            host,
            _alone: alone,
        }
    }

    /// `docker -H <engine> args...`: (exit code, stdout).
    pub fn docker(&self, args: &[&str]) -> (i32, String) {
        let out = Command::new("docker")
            .arg("-H")
            .arg(&self.host)
            .args(args)
            .output()
            .expect("docker runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
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
        if let Ok(out) = Command::new("bash")
            .args([script().as_str(), "stop"])
            .output()
        {
            if !out.status.success() {
                eprintln!(
                    "the gVisor engine did not stop cleanly:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}
