//! Issue 45: the ranks the launcher starts on one host meet without a port. Checked on real
//! processes: this test binary, started by the launcher as the ranks (each runs this one test
//! and, seeing the launcher's variables, does a rank's rendezvous). While rank 0 serves and
//! rank 1 is held back, no socket of any rank listens on TCP (`/proc/net/tcp`, `tcp6`); rank 0
//! listens on a Unix socket in a directory of mode 700 owned by this user, which is gone when
//! the launch ends.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zcomm::LaunchEnv;
use zcomm::launch::{LAUNCHER_PID_VAR, LaunchSpec, launch};
use zcomm::rendezvous::{Config, Server, join};

const TEST: &str = "launch::no_port::the_ranks_of_one_host_open_no_port";

/// Where the parent and the ranks of one run leave their marks: keyed by the launcher's pid.
fn marks(launcher: u32) -> PathBuf {
    std::env::temp_dir().join(format!("zcomm-it-no-port-{launcher}"))
}

fn wait_for(path: &Path) {
    let until = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(Instant::now() < until, "{} never came", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A rank's part: rank 0 binds where the launcher said, says so and serves; rank 1 waits for
/// the parent's word, then joins.
fn rank(launcher: &str) {
    zcomm::launch::die_with_launcher().unwrap();
    let env = LaunchEnv::from_env().unwrap();
    let master = env.master.clone().expect("the launcher names a rendezvous");
    let dir = marks(launcher.parse().unwrap());
    let config = Config::from_env(&master, Duration::from_secs(60)).unwrap();
    if env.info.rank == 0 {
        let server = Server::bind(&master.address()).unwrap();
        std::fs::write(dir.join("bound"), master.address()).unwrap();
        server.serve(env.info.world, b"id", config).unwrap();
    } else {
        wait_for(&dir.join("go"));
        let (id, _) = join(&master.address(), env.info, config).unwrap();
        assert_eq!(id, b"id");
    }
}

/// The socket inodes the processes started by this one (the ranks of this test) hold.
fn rank_sockets() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut inodes = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().to_string();
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .unwrap_or("");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid != me || !String::from_utf8_lossy(&cmdline).contains(TEST) {
            continue;
        }
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let t = target.to_string_lossy();
                if let Some(inode) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                    inodes.push(inode.to_string());
                }
            }
        }
    }
    inodes
}

/// `/proc/net/tcp` and `tcp6` lines in state LISTEN (0A) whose inode is one of `inodes`.
fn tcp_listening(inodes: &[String]) -> Vec<String> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9])
        })
        .collect()
}

#[test]
fn the_ranks_of_one_host_open_no_port() {
    if let Some(launcher) = std::env::var_os(LAUNCHER_PID_VAR) {
        rank(&launcher.to_string_lossy());
        return;
    }
    let dir = marks(std::process::id());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let spec = LaunchSpec {
        program: std::env::current_exe().unwrap().into_os_string(),
        args: [TEST, "--exact", "--nocapture", "--test-threads=1"]
            .iter()
            .map(Into::into)
            .collect(),
        ranks: 2,
        grace: Duration::from_secs(5),
        peer_failure_code: None,
        nccl_max_channels: None,
    };
    let launched = std::thread::spawn(move || launch(&spec, &|| None));
    wait_for(&dir.join("bound"));
    // Rank 0 is serving and rank 1 has not joined: whatever rank 0 listens on, it is open now.
    let sockets = rank_sockets();
    assert!(!sockets.is_empty(), "the ranks hold sockets");
    let listening = tcp_listening(&sockets);
    assert!(listening.is_empty(), "a rank listens on TCP: {listening:?}");
    let addr = std::fs::read_to_string(dir.join("bound")).unwrap();
    let socket = zcomm::rendezvous::unix_path(&addr)
        .unwrap_or_else(|| panic!("rank 0 was given {addr}, not a Unix socket"))
        .to_path_buf();
    let private = socket.parent().unwrap().to_path_buf();
    let meta = std::fs::symlink_metadata(&private).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
    std::fs::write(dir.join("go"), "").unwrap();
    let out = launched.join().unwrap().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.exit_code(), 0, "{}", out.message());
    assert!(!private.exists(), "the socket's directory is removed");
}
