use super::*;

fn named<'a>(option: &'static str, path: &'a Path) -> Named<'a> {
    Named { option, path }
}

#[test]
fn an_output_that_is_the_data_file_is_refused_even_by_another_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data.csv");
    std::fs::write(&data, "precious").expect("write");
    let alias = dir.path().join("sub").join("..").join("data.csv");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    let hard = dir.path().join("hard.csv");
    std::fs::hard_link(&data, &hard).expect("link");
    for out in [&data, &alias, &hard] {
        let err = check_outputs(
            &[named("--checkpoint", out)],
            &[named("--data", &data)],
            &[("--checkpoint", "--resume")],
        )
        .expect_err("refused");
        assert!(err.to_string().contains("is the --data file"), "{err}");
    }
    assert_eq!(std::fs::read(&data).expect("read"), b"precious");
}

#[test]
fn checkpoint_onto_resume_is_legal_memory_report_onto_resume_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck.st");
    std::fs::write(&ck, "checkpoint").expect("write");
    let allowed = [("--checkpoint", "--resume")];
    check_outputs(
        &[named("--checkpoint", &ck)],
        &[named("--resume", &ck)],
        &allowed,
    )
    .expect("continuing its own checkpoint");
    let err = check_outputs(
        &[named("--memory-report", &ck)],
        &[named("--resume", &ck)],
        &allowed,
    )
    .expect_err("refused");
    assert!(err.to_string().contains("is the --resume file"), "{err}");
}

#[test]
fn two_outputs_on_one_file_are_refused_even_before_it_exists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("out");
    let b = dir.path().join(".").join("out");
    let err = check_outputs(
        &[named("--checkpoint", &a), named("--memory-report", &b)],
        &[],
        &[],
    )
    .expect_err("refused");
    assert!(
        err.to_string().contains("also the --checkpoint file"),
        "{err}"
    );
}

#[test]
fn symlinks_devices_and_folders_are_never_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("target");
    std::fs::write(&target, "keep").expect("write");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    for p in [link.as_path(), Path::new("/dev/null"), dir.path()] {
        let err = check_outputs(&[named("--checkpoint", p)], &[], &[]).expect_err("refused");
        assert!(
            err.to_string().contains("not a regular file"),
            "{}: {err}",
            p.display()
        );
    }
    assert!(
        std::fs::symlink_metadata(&link)
            .expect("still there")
            .is_symlink()
    );
}

#[test]
fn an_output_in_a_missing_folder_is_refused_before_training() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("no-such-folder").join("ck.st");
    let err = check_outputs(&[named("--checkpoint", &p)], &[], &[]).expect_err("refused");
    assert!(err.to_string().contains("nothing was trained"), "{err}");
    let ok = dir.path().join("ck.st");
    check_outputs(&[named("--checkpoint", &ok)], &[], &[]).expect("writable");
    assert!(
        !temp_path(&ok).exists() && !ok.exists(),
        "the probe leaves nothing"
    );
}

#[test]
fn a_full_disk_keeps_the_previous_file_and_removes_the_partial_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("ck.st");
    write_atomically(&p, "writing", b"previous checkpoint").expect("first write");
    let err = write_atomically_with(&p, "writing", b"new checkpoint", |f, b| {
        f.write_all(&b[..4])?;
        Err(io::Error::from_raw_os_error(28)) // ENOSPC
    })
    .expect_err("disk full");
    assert!(err.to_string().contains("ck.st.tmp"), "{err}");
    assert_eq!(std::fs::read(&p).expect("read"), b"previous checkpoint");
    assert!(!temp_path(&p).exists(), "the partial .tmp is removed");
    write_atomically(&p, "writing", b"next").expect("later write");
    assert_eq!(std::fs::read(&p).expect("read"), b"next");
}

#[test]
fn reads_are_bounded_and_work_on_character_devices() {
    let err = read_bounded(Path::new("/dev/zero"), "reading", 1000, "test bound")
        .expect_err("unbounded source");
    assert!(err.to_string().contains("more than 1000 bytes"), "{err}");
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("f");
    std::fs::write(&p, b"12345").expect("write");
    assert_eq!(read_bounded(&p, "reading", 5, "").expect("fits"), b"12345");
    assert!(read_bounded(&p, "reading", 4, "").is_err());
}
