//! The configuration file's layering, keys and errors.

use super::*;

#[test]
fn every_setting_is_a_worker_flag_once() {
    let cmd = command();
    let worker = cmd.find_subcommand("worker").unwrap();
    let mut keys = BTreeSet::new();
    let mut args = BTreeSet::new();
    for s in SETTINGS {
        assert!(keys.insert(s.key), "{} twice", s.key);
        assert!(args.insert(s.arg), "{} twice", s.arg);
        let arg = worker.get_arguments().find(|a| a.get_id() == s.arg);
        let arg = arg.unwrap_or_else(|| panic!("{} names no argument", s.arg));
        assert!(arg.get_env().is_some(), "{} has an environment variable", s.key);
    }
    // Every worker flag but the file itself and hidden ones is a setting.
    for arg in worker.get_arguments() {
        let id = arg.get_id().as_str();
        if arg.is_hide_set() || ["config", "help", "log"].contains(&id) || arg.get_long().is_none() {
            continue;
        }
        assert!(args.contains(id), "--{} has no key in the configuration file", id);
    }
}

fn file(text: &str) -> (tempfile_path::Dir, PathBuf) {
    let dir = tempfile_path::Dir::new();
    let path = dir.0.join("sluice.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// A directory removed on drop (the host has no tempfile dependency).
mod tempfile_path {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            let p = std::env::temp_dir().join(format!("sluice-config-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn argv(args: &[&str]) -> Vec<OsString> {
    std::iter::once("sluice")
        .chain(args.iter().copied())
        .map(OsString::from)
        .collect()
}

#[test]
fn the_file_sits_under_flags_and_over_defaults() {
    let (dir, path) = file(
        "num.standby.replicas = 2\ncommit.interval.ms = 250\n\
         guest.pooling = false\nheartbeat.interval.ms = 500\ntopologies = [\"a.toml\", \"b.toml\"]\n\
         [admin]\nlistener = \"127.0.0.1:0\"\n[tenants.t]\nnamespace = \"t.\"\n",
    );
    let p = path.to_str().unwrap();
    // The environment sits over the file (no other test reads this variable).
    std::env::set_var("SLUICE_HEARTBEAT_INTERVAL_MS", "1s");
    let (_, l) = parse(argv(&["config", "show", "--config", p, "--standby-replicas", "1"])).unwrap();
    assert_eq!(l.values["num.standby.replicas"], "1");
    assert_eq!(l.origins["num.standby.replicas"], Origin::Flag);
    assert_eq!(l.values["commit.interval.ms"], "250ms");
    assert_eq!(l.origins["commit.interval.ms"], Origin::File);
    assert_eq!(l.values["guest.pooling"], "false");
    assert_eq!(l.origins["punctuate.interval.ms"], Origin::Default);
    assert_eq!(l.values["heartbeat.interval.ms"], "1s");
    assert_eq!(
        l.origins["heartbeat.interval.ms"],
        Origin::Env("SLUICE_HEARTBEAT_INTERVAL_MS".into())
    );
    assert_eq!(l.origins["worker.capacity"], Origin::Unset);
    assert_eq!(l.origins["admin.listener"], Origin::File);
    // Paths in the file are relative to it.
    let a = dir.0.join("a.toml");
    let b = dir.0.join("b.toml");
    assert_eq!(l.values["topologies"], format!("{},{}", a.display(), b.display()));
    assert_eq!(l.tenancy.tenants["t"].namespace, "t.");
    // The worker's own parse sees the same.
    let (cli, l) = parse(argv(&["worker", "--config", p])).unwrap();
    assert!(matches!(cli.command, super::super::Command::Worker(_)));
    assert_eq!(l.values["num.standby.replicas"], "2");
    // (No bootstrap.servers in this file: KAFKA_BOOTSTRAP, set where tests run against
    // Kafka, would sit over it.)
    assert_eq!(
        l.decided_by_file(),
        5,
        "all but the heartbeat, which the environment sets"
    );
}

#[test]
fn a_bad_file_names_its_key() {
    let (_dir, path) = file("num.standby.replicas = -3\n");
    let e = parse(argv(&["worker", "--config", path.to_str().unwrap()]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("num.standby.replicas = -3: invalid value '-3'"), "{e}");
    let (_dir, path) = file("[session]\ntimeout.ms = true\n");
    let e = parse(argv(&["worker", "--config", path.to_str().unwrap()]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("session.timeout.ms = true: expected milliseconds"), "{e}");
    let (_dir, path) = file("bootstrap = \"x\"\n");
    let e = parse(argv(&["worker", "--config", path.to_str().unwrap()]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown key `bootstrap`"), "{e}");
    let (_dir, path) = file("[admin]\ntoken = []\n");
    let e = parse(argv(&["worker", "--config", path.to_str().unwrap()]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown key `admin.token`"), "{e}");
}

#[test]
fn the_documentation_lists_every_setting() {
    let doc = include_str!("../../../../docs/configuration.md");
    for s in SETTINGS {
        assert!(
            doc.contains(&format!("| `{}` |", s.key)),
            "docs/configuration.md lacks {}",
            s.key
        );
    }
}

#[test]
fn unknown_keys_are_named_with_the_nearest_one() {
    let e = unknown("num.standbys.replicas");
    assert!(e.contains("`num.standbys.replicas`"), "{e}");
    assert!(e.contains("did you mean `num.standby.replicas`"), "{e}");
    assert!(!unknown("completely.different.thing.entirely").contains("did you mean"));
}
