//! The job secret (issue 23): given in `ZCOMM_SECRET` or a file only its owner can read; a job
//! that other hosts can reach refuses to start without one unless the user opts out.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use zcomm::secret::read_secret_file;
use zcomm::{Auth, CommError, JobSecret, Master};

fn auth(host: &str, vars: &[(&str, &str)]) -> Result<Auth, CommError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    let master = Master {
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
    // On loopback only this host's processes can reach the port: allowed, with a warning.
    for host in ["127.0.0.1", "localhost", "::1", "[::1]"] {
        assert_eq!(auth(host, &[]).unwrap(), Auth::Unauthenticated, "{host}");
    }
}

#[test]
fn a_secret_in_the_environment_is_used_and_a_short_one_refused() {
    let a = auth("10.0.0.7", &[("ZCOMM_SECRET", "0123456789abcdef0123")]).unwrap();
    assert_eq!(
        a,
        Auth::Secret(JobSecret::from_text("0123456789abcdef0123", "x").unwrap())
    );
    let e = auth("10.0.0.7", &[("ZCOMM_SECRET", "short")]).unwrap_err();
    assert!(e.to_string().contains("16 to 4096 bytes"), "{e}");
    // Debug never shows it.
    assert!(!format!("{a:?}").contains("0123456789"), "{a:?}");
}

#[test]
fn a_secret_file_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    std::fs::write(&path, "0123456789abcdef-from-a-file\n").unwrap();
    for mode in [0o644, 0o640, 0o604, 0o660] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = read_secret_file(&path).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{mode:o}: {e}");
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let p = path.to_str().unwrap();
    let a = auth("10.0.0.7", &[("ZCOMM_SECRET_FILE", p)]).unwrap();
    assert_eq!(
        a,
        Auth::Secret(JobSecret::from_text("0123456789abcdef-from-a-file", "x").unwrap())
    );
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
