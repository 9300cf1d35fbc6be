//! The job secret (issues 23 and 45): a key of 128 bits or more, given in `ZCOMM_SECRET` or a
//! regular file of the running user only it can read; a job refuses to start without one
//! (loopback too) unless the user opts out. No message shows a secret.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use zcomm::secret::read_secret_file;
use zcomm::{Auth, CommError, JobSecret, Master};

fn auth(host: &str, vars: &[(&str, &str)]) -> Result<Auth, CommError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    let master = Master::Tcp {
        host: host.into(),
        port: 29500,
    };
    Auth::from_vars(&master, |k| map.get(k).cloned())
}

#[test]
fn a_job_across_hosts_without_a_secret_refuses_to_start_and_says_how_to_fix_it() {
    let e = auth("10.0.0.7", &[]).unwrap_err();
    assert!(matches!(e, CommError::NoSecret { .. }), "{e:?}");
    for hint in [
        "ZCOMM_SECRET",
        "ZCOMM_SECRET_FILE",
        "ZCOMM_ALLOW_UNAUTHENTICATED=1",
    ] {
        assert!(e.to_string().contains(hint), "{e}");
    }
    // Opting out is explicit.
    let opted = auth("10.0.0.7", &[("ZCOMM_ALLOW_UNAUTHENTICATED", "1")]).unwrap();
    assert_eq!(opted, Auth::Unauthenticated);
    let e = auth("10.0.0.7", &[("ZCOMM_ALLOW_UNAUTHENTICATED", "yes")]).unwrap_err();
    assert!(matches!(e, CommError::BadEnv { .. }), "{e:?}");
}

/// Issue 45: another user of the host reaches a loopback port as well as the job's own ranks
/// do; a loopback job without a secret was open to them.
#[test]
fn a_loopback_job_without_a_secret_refuses_to_start_too() {
    for host in ["127.0.0.1", "localhost", "::1", "[::1]"] {
        let e = auth(host, &[]).unwrap_err();
        assert!(matches!(e, CommError::NoSecret { .. }), "{host}: {e:?}");
        let opted = auth(host, &[("ZCOMM_ALLOW_UNAUTHENTICATED", "1")]).unwrap();
        assert_eq!(opted, Auth::Unauthenticated, "{host}");
    }
}

const KEY: &str = "0123456789abcdef0123456789abcdef";

#[test]
fn a_secret_in_the_environment_is_used_and_a_short_one_refused() {
    let a = auth("10.0.0.7", &[("ZCOMM_SECRET", KEY)]).unwrap();
    assert_eq!(a, Auth::Secret(JobSecret::from_text(KEY, "x").unwrap()));
    let e = auth("10.0.0.7", &[("ZCOMM_SECRET", "0123456789abcdef")]).unwrap_err();
    assert!(matches!(e, CommError::WeakSecret { .. }), "{e:?}");
    assert!(e.to_string().contains("64 bits"), "{e}");
    // Debug never shows it.
    assert!(!format!("{a:?}").contains("0123456789"), "{a:?}");
}

/// Issue 45: one recorded handshake let an 18-character phrase fall in 216 guesses. A secret
/// is a key of 128 bits or more; anything else is a typed error that never shows it.
#[test]
fn a_phrase_or_a_key_under_128_bits_is_refused_without_being_shown() {
    for (text, problem) in [
        (
            "correct horse battery",
            "character 2 of 21 is not a hex digit",
        ),
        ("0123456789abcdef0123456789abcde", "124 bits"),
        ("0123456789abcdef0123456789abcdeg", "character 32 of 32"),
        ("", "0 bits"),
    ] {
        let e = JobSecret::from_text(text, "ZCOMM_SECRET").unwrap_err();
        assert!(matches!(e, CommError::WeakSecret { .. }), "{e:?}");
        let shown = e.to_string();
        assert!(shown.contains(problem), "{shown}");
        assert!(shown.contains("ztrain --make-secret FILE"), "{shown}");
        if !text.is_empty() {
            assert!(!shown.contains(text), "the secret is shown: {shown}");
        }
    }
    assert!(JobSecret::from_text(&KEY.to_uppercase(), "x").is_ok());
    assert!(JobSecret::from_text(&format!("{KEY}\n"), "x").is_ok());
}

/// Issue 45: a value that is not UTF-8 panicked `std::env::vars()` with the value (the secret
/// itself, when that was the variable) in the message.
#[test]
fn a_variable_that_is_not_utf8_is_named_and_never_shown() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt as _;
    let master = Master::Tcp {
        host: "10.0.0.7".into(),
        port: 29500,
    };
    let bad = OsString::from_vec(b"s3cr3t\xff\xfe".to_vec());
    for var in ["ZCOMM_SECRET", "ZCOMM_ALLOW_UNAUTHENTICATED"] {
        let e = Auth::from_os_vars(&master, |k| (k == var).then(|| bad.clone())).unwrap_err();
        assert!(
            matches!(e, CommError::EnvNotUtf8 { var: v } if v == var),
            "{e:?}"
        );
        assert!(!format!("{e} {e:?}").contains("s3cr3t"), "{e}");
    }
    for var in zcomm::env::VARS {
        let e = zcomm::LaunchEnv::from_os_vars(|k| {
            if k == var {
                Some(bad.clone())
            } else {
                Some(OsString::from("1"))
            }
        })
        .unwrap_err();
        assert!(
            matches!(e, CommError::EnvNotUtf8 { var: v } if v == var),
            "{e:?}"
        );
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
    }
}

#[test]
fn a_secret_file_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    std::fs::write(&path, format!("{KEY}\n")).unwrap();
    for mode in [0o644, 0o640, 0o604, 0o660] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = read_secret_file(&path).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{mode:o}: {e}");
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let p = path.to_str().unwrap();
    let a = auth("10.0.0.7", &[("ZCOMM_SECRET_FILE", p)]).unwrap();
    assert_eq!(a, Auth::Secret(JobSecret::from_text(KEY, "x").unwrap()));
    let e = auth("10.0.0.7", &[("ZCOMM_SECRET_FILE", "/no/such/file")]).unwrap_err();
    assert!(matches!(e, CommError::Secret { .. }), "{e:?}");
}

#[test]
fn every_generated_secret_is_new() {
    let a = JobSecret::generate().unwrap();
    let b = JobSecret::generate().unwrap();
    assert_ne!(a, b);
    assert_eq!(a.as_env_value().len(), 64);
}

fn refused(path: &std::path::Path, needle: &str) {
    let e = read_secret_file(path).unwrap_err();
    assert!(matches!(e, CommError::Secret { .. }), "{e:?}");
    assert!(e.to_string().contains(needle), "{e}");
}

/// Issue 45: a FIFO as the secret file hung the rank in open(2) past `--comm-timeout` and the
/// first Ctrl-C. It is refused at once, never waited on (no writer ever comes here).
#[test]
fn a_fifo_as_the_secret_file_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let p = fifo.clone();
    std::thread::spawn(move || tx.send(read_secret_file(&p).map_err(|e| e.to_string())));
    // Generous: the answer comes at once; a hang (the bug) never answers.
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("read_secret_file waited on a FIFO with no writer");
    let e = got.unwrap_err();
    assert!(e.contains("not a regular file"), "{e}");
}

#[test]
fn a_link_to_a_secret_file_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::write(&real, KEY).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    refused(&link, "symbolic link");
    assert!(read_secret_file(&real).is_ok());
}

/// Issue 45: a root job accepted a 0600 secret file owned by another user, who can rewrite it.
#[test]
fn a_secret_file_of_another_owner_is_refused_even_for_root() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("theirs");
    std::fs::write(&path, KEY).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    if nix::unistd::geteuid().is_root() {
        nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        refused(&path, "owned by uid 65534");
    } else {
        // Another user's file this user can open: root's.
        refused(std::path::Path::new("/etc/passwd"), "owned by uid 0");
    }
}

#[test]
fn a_secret_file_longer_than_a_secret_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big");
    std::fs::write(&path, "a".repeat(8192)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    refused(&path, "8192 bytes");
}

#[test]
fn make_secret_writes_a_new_key_only_its_owner_reads_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.key");
    let made = zcomm::secret::write_new_secret_file(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(read_secret_file(&path).unwrap(), made);
    assert_eq!(made.as_env_value().len(), 64);
    let e = zcomm::secret::write_new_secret_file(&path).unwrap_err();
    assert!(e.to_string().contains("must not exist yet"), "{e}");
    assert_eq!(read_secret_file(&path).unwrap(), made, "overwritten");
}
