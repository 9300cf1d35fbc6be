//! `cargo xtask test-gpu --sanitize`: compute-sanitizer over the GPU suites with zmem's
//! sanitizer mode on, after the planted out-of-bounds control. The work is done by the
//! bundle's `sanitize.sh` (so a GPU machine without Rust runs the same thing); this builds the
//! test binaries beside it and runs it.

use std::path::Path;
use std::process::Command;

use crate::error::{Result, XtaskError, io};

/// The bundle's `sanitize.sh`.
pub const SANITIZE_SH: &str = include_str!("sanitize.sh");

/// The compute-sanitizer tools `sanitize.sh` knows.
pub const TOOLS: [&str; 4] = ["memcheck", "racecheck", "initcheck", "synccheck"];

/// Checks a tool list (`all` or comma-separated names from [`TOOLS`]).
pub fn check_tools(list: &str) -> Result<()> {
    if list == "all" {
        return Ok(());
    }
    for t in list.split(',') {
        if !TOOLS.contains(&t) {
            return Err(XtaskError::Other(format!(
                "unknown sanitizer tool `{t}` (expected `all` or some of {})",
                TOOLS.join(", ")
            )));
        }
    }
    Ok(())
}

/// Checks a `--sanitize-run` spec, `SUITE[:FILTER][=TOOLS]`.
pub fn check_run(spec: &str) -> Result<()> {
    let (target, tools) = spec.split_once('=').unwrap_or((spec, "all"));
    let suite = target.split_once(':').map_or(target, |(s, _)| s);
    if suite.is_empty() || suite.contains('/') {
        return Err(XtaskError::Other(format!(
            "`{spec}`: expected SUITE[:FILTER]=TOOLS, SUITE a binary-name prefix (zmem, zgrad, ...)"
        )));
    }
    check_tools(tools)
}

/// The arguments for `sanitize.sh`.
pub fn script_args(tools: Option<&str>, runs: &[String], control: bool) -> Result<Vec<String>> {
    let mut args = Vec::new();
    if let Some(t) = tools {
        check_tools(t)?;
        args.extend(["--tools".to_string(), t.to_string()]);
    }
    for r in runs {
        check_run(r)?;
        args.extend(["--run".to_string(), r.clone()]);
    }
    if !control {
        args.push("--no-control".into());
    }
    Ok(args)
}

/// Writes `sanitize.sh` into `dir` (executable).
pub fn write_script(dir: &Path) -> Result<()> {
    let script = dir.join("sanitize.sh");
    std::fs::write(&script, SANITIZE_SH).map_err(io("writing", &script))?;
    crate::hw_tests::set_executable(&script)
}

/// Runs `dir/sanitize.sh` with `args`; fails when it does.
pub fn run_script(dir: &Path, args: &[String]) -> Result<()> {
    let script = dir.join("sanitize.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).args(args);
    let shown = format!("{cmd:?}");
    let status = cmd.status().map_err(|e| XtaskError::Command {
        command: shown.clone(),
        reason: e.to_string(),
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(XtaskError::Command {
            command: shown,
            reason: status.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_lists_and_run_specs_are_checked() {
        assert!(check_tools("all").is_ok());
        assert!(check_tools("memcheck,synccheck").is_ok());
        assert!(check_tools("memcheck,leakcheck").is_err());
        assert!(check_run("zmem=all").is_ok());
        assert!(check_run("zcompute:cuda::matmul=memcheck").is_ok());
        assert!(check_run("zgrad").is_ok());
        assert!(check_run("=memcheck").is_err());
        assert!(check_run("zmem=racecheck,bogus").is_err());
        let args = script_args(Some("memcheck"), &["zmem=all".into()], false).unwrap();
        assert_eq!(
            args,
            ["--tools", "memcheck", "--run", "zmem=all", "--no-control"]
        );
    }

    /// `sanitize.sh` end to end over a fake bundle and a fake compute-sanitizer that reports
    /// one error exactly when the planted write runs in sanitizer mode (`ZMEM_PLANT_OOB=1`,
    /// `ZMEM_SANITIZE=1`), and `FAKE_SUITE_ERRORS` errors in every other run.
    fn fake_run(suite_errors: &str, control_seen: bool, args: &[&str]) -> (bool, String) {
        let dir = std::env::temp_dir().join(format!(
            "xtask-sanitize-{}-{suite_errors}-{control_seen}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        write_script(&dir).unwrap();
        let test_bin = "#!/usr/bin/env bash\n\
            if [ \"$1\" = --list ]; then [ \"$3\" = --skip ] && [ \"$4\" = negative_control ] || exit 1; echo 'gpu::gpu_a: test'; exit 0; fi\n\
            case \" $* \" in *' --skip negative_control '*|*' --exact '*) ;; *) exit 3 ;; esac\n\
            echo \"test gpu::gpu_planted_out_of_bounds_write_inside_a_block ... ok\"\n\
            echo \"test result: ok. 1 passed; 0 failed; 0 ignored\"\n";
        for name in ["zmem-test-it", "zgrad-test-it"] {
            let p = dir.join("bin").join(name);
            std::fs::write(&p, test_bin).unwrap();
            crate::hw_tests::set_executable(&p).unwrap();
        }
        let plant = if control_seen { 1 } else { 0 };
        let fake = format!(
            "#!/usr/bin/env bash\n\
             [ \"$1\" = --version ] && {{ echo fake 1.0; exit 0; }}\n\
             while [ \"${{1#--}}\" != \"$1\" ]; do shift 2; done\n\"$@\"\n\
             if [ {suite_errors} = none ] && [ \"${{ZMEM_PLANT_OOB:-0}}\" != 1 ]; then\n\
               echo \"========= Error: Target application terminated before first instrumented API call\"; exit 255\n\
             fi\n\
             if [ \"${{ZMEM_PLANT_OOB:-0}}\" = 1 ]; then\n\
               if [ \"$ZMEM_SANITIZE\" = 1 ]; then n={plant}; else n=0; fi\n\
             else n={suite_errors}; fi\n\
             echo \"========= ERROR SUMMARY: $n errors\"\n"
        );
        let cs = dir.join("compute-sanitizer");
        std::fs::write(&cs, fake).unwrap();
        crate::hw_tests::set_executable(&cs).unwrap();
        let out = Command::new("bash")
            .arg(dir.join("sanitize.sh"))
            .args(args)
            .env("COMPUTE_SANITIZER", &cs)
            .env("OUT", &dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let _ = std::fs::remove_dir_all(&dir);
        (out.status.success(), text)
    }

    #[test]
    fn sanitize_sh_passes_clean_runs_and_prints_a_line_per_binary_and_tool() {
        let (ok, text) = fake_run("0", true, &["--run", "zmem=memcheck,initcheck"]);
        assert!(ok, "{text}");
        assert!(
            text.contains("control planted out-of-bounds write: memcheck 1 error(s)"),
            "{text}"
        );
        assert_eq!(text.matches("sanitize: zmem-test-it ").count(), 2, "{text}");
        assert!(!text.contains("zgrad-test-it"), "{text}");
    }

    #[test]
    fn sanitize_sh_fails_on_any_reported_error() {
        let (ok, text) = fake_run("3", true, &["--tools", "memcheck"]);
        assert!(!ok, "{text}");
        assert!(
            text.contains("3 error(s)") && text.contains("FAILED"),
            "{text}"
        );
    }

    #[test]
    fn a_binary_whose_gpu_named_tests_make_no_cuda_call_is_not_a_failure() {
        // compute-sanitizer exits 255 with "terminated before first instrumented API call" when
        // the matching tests (simulated twins named `gpu`) never touch CUDA.
        let (ok, text) = fake_run("none", true, &["--run", "zmem=memcheck"]);
        assert!(ok, "{text}");
        assert!(text.contains("ok (no CUDA call)"), "{text}");
    }

    #[test]
    fn sanitize_sh_fails_when_the_planted_write_goes_unseen() {
        let (ok, text) = fake_run("0", false, &["--run", "zmem=memcheck"]);
        assert!(!ok, "{text}");
        assert!(text.contains("sanitizer mode must report it"), "{text}");
    }
}
