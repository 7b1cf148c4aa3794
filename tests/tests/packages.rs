//! The Debian packages (`scripts/package.sh`, docs/install-edge-agent.md
//! and docs/install-registry.md "From the Debian package"): built from the
//! binaries already in target/debug, lintian finds no error, and both
//! install into a fresh Debian 12 (bookworm) root with their dependencies
//! from its apt. There the binaries run, the users, groups, directories and
//! units are what the docs say, an upgrade keeps edited configuration, and
//! a purge removes the state.
//!
//! Needs root (chroot, an overlay mount), debootstrap, lintian and, for the
//! first run or a dependency not yet cached, the network: the debootstrap
//! root is made once and cached in /var/tmp/benchlink-debroot (or
//! `$BENCHLINK_DEBROOT`), together with the .debs apt fetched; every run
//! starts from a fresh overlay on it.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use benchlink_e2e::{free_port, workspace_bin};
use benchlink_testkit::{skip_unless_ci, stdout_lines, tool_installed, KillOnDrop};

const MIRROR: &str = "http://deb.debian.org/debian";
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cache_dir() -> PathBuf {
    std::env::var_os("BENCHLINK_DEBROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/benchlink-debroot"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `cmd`, panics with its output unless it exits 0.
fn ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

fn chroot(root: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("chroot");
    cmd.arg(root)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    cmd
}

/// `args` run in the root as `user` (with the user's groups).
fn chroot_as(root: &Path, user: &str, args: &[&str]) -> Command {
    let mut all = vec![
        "setpriv",
        "--reuid",
        user,
        "--regid",
        user,
        "--init-groups",
        "--",
    ];
    all.extend_from_slice(args);
    chroot(root, &all)
}

fn stdout_of(root: &Path, args: &[&str]) -> String {
    text(&ok(&mut chroot(root, args)).stdout).trim().to_string()
}

/// True when deb.debian.org accepts a TCP connection within 5 s.
fn mirror_reachable() -> bool {
    ("deb.debian.org", 80)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_secs(5)).ok())
        .is_some()
}

/// The cached minbase bookworm root, made by debootstrap (with apt's
/// package lists) on the first run.
fn base_root() -> Option<PathBuf> {
    let base = cache_dir().join("bookworm-minbase");
    if base.join("usr/bin/apt-get").exists() {
        return Some(base);
    }
    if !mirror_reachable() {
        skip_unless_ci(&format!(
            "no Debian 12 root cached at {} and {MIRROR} is unreachable",
            base.display()
        ));
        return None;
    }
    std::fs::create_dir_all(cache_dir()).unwrap();
    let partial = cache_dir().join(format!("bookworm-minbase.partial-{}", std::process::id()));
    let started = Instant::now();
    ok(Command::new("debootstrap")
        .args(["--variant=minbase", "bookworm"])
        .arg(&partial)
        .arg(MIRROR));
    std::fs::copy("/etc/resolv.conf", partial.join("etc/resolv.conf")).unwrap();
    ok(&mut chroot(&partial, &["apt-get", "update", "-qq"]));
    std::fs::rename(&partial, &base).unwrap();
    eprintln!(
        "debootstrap: {} made in {:.0} s",
        base.display(),
        started.elapsed().as_secs_f64()
    );
    Some(base)
}

/// A fresh root for one run: an overlay on the cached one (a copy where
/// overlayfs is not available), unmounted and removed on drop.
struct FreshRoot {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl FreshRoot {
    fn new(base: &Path) -> FreshRoot {
        let dir = tempfile::Builder::new()
            .prefix("benchlink-packages-")
            .tempdir_in(cache_dir())
            .unwrap();
        for d in ["upper", "work", "root"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            base.display(),
            dir.path().join("upper").display(),
            dir.path().join("work").display()
        );
        let mounted = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(dir.path().join("root"))
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !mounted {
            std::fs::remove_dir(dir.path().join("root")).unwrap();
            ok(Command::new("cp")
                .arg("-a")
                .arg(base)
                .arg(dir.path().join("root")));
        }
        FreshRoot { dir, mounted }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("root")
    }
}

impl Drop for FreshRoot {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn owner(path: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.uid(), m.gid())
}

/// uid and gid of `user` in the root.
fn ids(root: &Path, user: &str) -> (u32, u32) {
    let uid = stdout_of(root, &["id", "-u", user]).parse().unwrap();
    let gid = stdout_of(root, &["id", "-g", user]).parse().unwrap();
    (uid, gid)
}

/// `deb` rebuilt as version `version` (same contents, uncompressed), for
/// an upgrade.
fn with_version(deb: &Path, version: &str, out: &Path) -> PathBuf {
    let tree = tempfile::tempdir_in(out).unwrap();
    ok(Command::new("dpkg-deb").arg("-R").arg(deb).arg(tree.path()));
    let control = tree.path().join("DEBIAN/control");
    let old = std::fs::read_to_string(&control).unwrap();
    let new: String = old
        .lines()
        .map(|l| {
            if l.starts_with("Version: ") {
                format!("Version: {version}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert_ne!(old, new, "no Version line in {}", control.display());
    std::fs::write(&control, new).unwrap();
    let name = deb
        .file_name()
        .unwrap()
        .to_string_lossy()
        .replace(&format!("_{VERSION}-1_"), &format!("_{version}_"));
    let path = out.join(name);
    ok(Command::new("dpkg-deb")
        .args(["-Znone", "--root-owner-group", "-b"])
        .arg(tree.path())
        .arg(&path));
    path
}

/// GET `path` from 127.0.0.1:`port`; the response's body.
fn http_get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string()
}

/// `apt-get install` of the packages in the root, with the .debs apt
/// fetched before; once more after `apt-get update` if the cached lists
/// name versions the mirror dropped.
fn apt_install(root: &Path, debs: &[&str]) {
    let archives = cache_dir().join("archives");
    std::fs::create_dir_all(&archives).unwrap();
    let in_root = root.join("var/cache/apt/archives");
    for e in std::fs::read_dir(&archives).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), in_root.join(e.file_name())).unwrap();
    }
    std::fs::copy("/etc/resolv.conf", root.join("etc/resolv.conf")).unwrap();
    let mut args = vec!["apt-get", "install", "-y", "-q", "--no-install-recommends"];
    args.extend_from_slice(debs);
    let first = chroot(root, &args).output().unwrap();
    if !first.status.success() {
        eprintln!(
            "apt-get install failed, updating the lists: {}",
            text(&first.stdout)
        );
        if !mirror_reachable() {
            skip_unless_ci(&format!(
                "{MIRROR} is unreachable and the packages' dependencies are not cached"
            ));
            panic!("{MIRROR} is unreachable:\n{}", text(&first.stderr));
        }
        ok(&mut chroot(root, &["apt-get", "update", "-qq"]));
        ok(&mut chroot(root, &args));
    }
    for e in std::fs::read_dir(&in_root).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().ends_with(".deb") {
            let _ = std::fs::copy(e.path(), archives.join(e.file_name()));
        }
    }
}

#[test]
fn packages_build_pass_lintian_install_upgrade_and_purge() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip_unless_ci("the package install test needs root (chroot, mount)");
        return;
    }
    for tool in ["debootstrap", "lintian", "dpkg-deb", "chroot"] {
        if !tool_installed(tool) {
            return;
        }
    }
    let started = Instant::now();

    // The packages, from the binaries the workspace build made.
    let target = workspace_bin("edge-agent")
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf();
    for b in ["cloud-registry", "benchlink"] {
        workspace_bin(b);
    }
    let built = ok(Command::new(repo().join("scripts/package.sh"))
        .args(["--profile", "dev", "--no-build", "--fast", "--lint"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(repo()));
    let listed = text(&built.stdout);
    eprintln!("package.sh --lint:\n{listed}{}", text(&built.stderr));
    let debian = target.join("debian");
    let edge_deb = debian.join(format!("edge-agent_{VERSION}-1_amd64.deb"));
    let registry_deb = debian.join(format!("cloud-registry_{VERSION}-1_amd64.deb"));
    for deb in [&edge_deb, &registry_deb] {
        assert!(listed.contains(deb.to_str().unwrap()), "{listed}");
    }
    let packaged = started.elapsed();

    let Some(base) = base_root() else { return };
    let fresh = FreshRoot::new(&base);
    let root = fresh.path();
    let debs_dir = root.join("tmp/debs");
    std::fs::create_dir_all(&debs_dir).unwrap();
    for deb in [&edge_deb, &registry_deb] {
        std::fs::copy(deb, debs_dir.join(deb.file_name().unwrap())).unwrap();
    }
    let in_root = |deb: &Path| format!("/tmp/debs/{}", deb.file_name().unwrap().to_string_lossy());
    let install_started = Instant::now();
    apt_install(&root, &[&in_root(&edge_deb), &in_root(&registry_deb)]);
    let installed = install_started.elapsed();

    // The binaries run from the root.
    for (bin, pkg) in [
        ("edge-agent", "edge-agent"),
        ("cloud-registry", "cloud-registry"),
        ("benchlink", "cloud-registry"),
    ] {
        let v = stdout_of(&root, &[&format!("/usr/bin/{bin}"), "--version"]);
        assert_eq!(v, format!("{bin} {VERSION}"));
        let owner = stdout_of(&root, &["dpkg-query", "-S", &format!("/usr/bin/{bin}")]);
        assert_eq!(owner, format!("{pkg}: /usr/bin/{bin}"));
    }
    assert!(
        !root.join("usr/bin/bench-sim").exists(),
        "bench-sim is for tests only"
    );

    // Users and groups.
    let edge_user = stdout_of(&root, &["getent", "passwd", "benchlink-edge"]);
    assert!(
        edge_user.ends_with(":/var/lib/benchlink-edge:/usr/sbin/nologin"),
        "{edge_user}"
    );
    let edge_groups = stdout_of(&root, &["id", "-nG", "benchlink-edge"]);
    for g in ["benchlink-edge", "dialout", "audio", "video"] {
        assert!(
            edge_groups.split(' ').any(|x| x == g),
            "benchlink-edge in {g}: {edge_groups}"
        );
    }
    let registry_groups = stdout_of(&root, &["id", "-nG", "benchlink-registry"]);
    assert_eq!(registry_groups, "benchlink-registry");
    let (edge_uid, edge_gid) = ids(&root, "benchlink-edge");
    let (reg_uid, reg_gid) = ids(&root, "benchlink-registry");
    assert!(
        edge_uid < 1000 && reg_uid < 1000,
        "system users: {edge_uid} {reg_uid}"
    );

    // Directories, configuration, units.
    for (name, uid, gid, conf) in [
        ("benchlink-edge", edge_uid, edge_gid, "edge-agent.toml"),
        (
            "benchlink-registry",
            reg_uid,
            reg_gid,
            "cloud-registry.toml",
        ),
    ] {
        let state = root.join("var/lib").join(name);
        assert_eq!(
            (mode(&state), owner(&state)),
            (0o750, (uid, gid)),
            "{}",
            state.display()
        );
        let etc = root.join("etc").join(name);
        assert_eq!(
            (mode(&etc), owner(&etc)),
            (0o750, (0, gid)),
            "{}",
            etc.display()
        );
        let file = etc.join(conf);
        assert_eq!(
            (mode(&file), owner(&file)),
            (0o640, (0, gid)),
            "{}",
            file.display()
        );
    }
    assert_eq!(
        std::fs::read_to_string(root.join("etc/benchlink-edge/edge-agent.toml")).unwrap(),
        std::fs::read_to_string(repo().join("config/edge-agent.example.toml")).unwrap()
    );
    for (pkg, conf) in [
        ("edge-agent", "/etc/benchlink-edge/edge-agent.toml"),
        (
            "cloud-registry",
            "/etc/benchlink-registry/cloud-registry.toml",
        ),
    ] {
        let conffiles = stdout_of(&root, &["dpkg-query", "-W", "-f", "${Conffiles}", pkg]);
        assert!(conffiles.contains(conf), "{pkg} conffiles: {conffiles}");
        let unit = format!("{pkg}.service");
        assert_eq!(
            std::fs::read_to_string(root.join("lib/systemd/system").join(&unit)).unwrap(),
            std::fs::read_to_string(repo().join("systemd").join(&unit)).unwrap()
        );
        // Enabled (deb-systemd-helper's link), not started: no systemd runs here.
        let wants = root
            .join("etc/systemd/system/multi-user.target.wants")
            .join(&unit);
        assert!(
            wants.is_symlink(),
            "{} missing: {pkg} not enabled",
            wants.display()
        );
    }
    assert!(root.join("usr/share/doc/edge-agent/copyright").exists());
    assert!(root.join("usr/share/doc/cloud-registry/copyright").exists());

    // The shipped bench configuration: check-config, as the service's user,
    // names the missing token, and accepts the file once it is there.
    let edge_check = [
        "/usr/bin/edge-agent",
        "check-config",
        "--config",
        "/etc/benchlink-edge/edge-agent.toml",
    ];
    let no_token = chroot_as(&root, "benchlink-edge", &edge_check)
        .output()
        .unwrap();
    assert_eq!(no_token.status.code(), Some(2), "{no_token:?}");
    assert!(
        text(&no_token.stderr)
            .contains("registry.token_file: cannot read /etc/benchlink-edge/token"),
        "{}",
        text(&no_token.stderr)
    );
    let token = root.join("etc/benchlink-edge/token");
    std::fs::write(&token, "provider-token-for-the-test\n").unwrap();
    std::os::unix::fs::chown(&token, Some(0), Some(edge_gid)).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o640)).unwrap();
    let checked = ok(&mut chroot_as(&root, "benchlink-edge", &edge_check));
    assert!(
        text(&checked.stdout).contains(": OK: provider `provider-bench-07`"),
        "{checked:?}"
    );

    // The shipped registry configuration, edited as an administrator would
    // (ports free here): valid, and `serve` runs from it as its user with the
    // store in /var/lib/benchlink-registry and the packaged Earth data.
    let reg_conf = root.join("etc/benchlink-registry/cloud-registry.toml");
    let (http_port, mqtt_port) = (free_port(), free_port());
    let shipped = std::fs::read_to_string(&reg_conf).unwrap();
    let edited = shipped
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{http_port}"))
        .replace("127.0.0.1:18830", &format!("127.0.0.1:{mqtt_port}"));
    assert_ne!(shipped, edited);
    std::fs::write(&reg_conf, &edited).unwrap();
    let reg_args = ["--config", "/etc/benchlink-registry/cloud-registry.toml"];
    let valid = ok(&mut chroot_as(
        &root,
        "benchlink-registry",
        &[
            "/usr/bin/cloud-registry",
            "check-config",
            reg_args[0],
            reg_args[1],
        ],
    ));
    assert!(text(&valid.stdout).contains("is valid"), "{valid:?}");
    let mut serve = chroot_as(
        &root,
        "benchlink-registry",
        &["/usr/bin/cloud-registry", "serve", reg_args[0], reg_args[1]],
    );
    let mut registry = KillOnDrop(serve.stdout(Stdio::piped()).spawn().unwrap());
    let lines = stdout_lines(&mut registry);
    let ready = lines
        .recv_timeout(Duration::from_secs(60))
        .expect("cloud-registry serve printed no ready line in 60 s");
    assert!(ready.contains(r#""event":"ready""#), "{ready}");
    let health = http_get(http_port, "/healthz");
    assert!(health.contains(r#""status":"ok""#), "{health}");
    let store = root.join("var/lib/benchlink-registry/cloud-registry.sqlite3");
    assert_eq!(owner(&store), (reg_uid, reg_gid));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(
        unsafe { libc::kill(registry.id() as i32, libc::SIGTERM) },
        0
    );
    let stopped = registry.wait().unwrap();
    assert!(stopped.success(), "serve after SIGTERM: {stopped}");

    // An upgrade keeps the edited configuration, the token and the state.
    let edge_conf = root.join("etc/benchlink-edge/edge-agent.toml");
    let mut edge_edited = std::fs::read_to_string(&edge_conf).unwrap();
    edge_edited.push_str("# edited on this bench\n");
    std::fs::write(&edge_conf, &edge_edited).unwrap();
    let next = format!("{VERSION}-2");
    let up_edge = with_version(&edge_deb, &next, &debs_dir);
    let up_registry = with_version(&registry_deb, &next, &debs_dir);
    ok(&mut chroot(
        &root,
        &["dpkg", "-i", &in_root(&up_edge), &in_root(&up_registry)],
    ));
    for pkg in ["edge-agent", "cloud-registry"] {
        assert_eq!(
            stdout_of(&root, &["dpkg-query", "-W", "-f", "${Version}", pkg]),
            next
        );
    }
    assert_eq!(std::fs::read_to_string(&edge_conf).unwrap(), edge_edited);
    assert_eq!(std::fs::read_to_string(&reg_conf).unwrap(), edited);
    assert_eq!(
        (mode(&edge_conf), owner(&edge_conf)),
        (0o640, (0, edge_gid))
    );
    assert!(token.exists() && store.exists());
    assert_eq!(ids(&root, "benchlink-edge"), (edge_uid, edge_gid));

    // Remove keeps configuration and state; purge removes both (the
    // administrator's token stays, and so do the users).
    ok(&mut chroot(
        &root,
        &["dpkg", "--remove", "edge-agent", "cloud-registry"],
    ));
    assert!(!root.join("usr/bin/edge-agent").exists());
    assert!(!root.join("usr/bin/cloud-registry").exists());
    assert!(edge_conf.exists() && reg_conf.exists() && store.exists());
    assert!(root.join("var/lib/benchlink-edge").is_dir());
    ok(&mut chroot(
        &root,
        &["dpkg", "--purge", "edge-agent", "cloud-registry"],
    ));
    for gone in [
        "var/lib/benchlink-edge",
        "var/lib/benchlink-registry",
        "etc/benchlink-edge/edge-agent.toml",
        "etc/benchlink-registry",
        "etc/systemd/system/multi-user.target.wants/edge-agent.service",
        "etc/systemd/system/multi-user.target.wants/cloud-registry.service",
        "lib/systemd/system/edge-agent.service",
    ] {
        assert!(!root.join(gone).exists(), "{gone} left after purge");
    }
    assert!(token.exists(), "purge removed the administrator's token");
    // --list exits 1 when there is no override at all.
    let overrides = chroot(&root, &["dpkg-statoverride", "--list"])
        .output()
        .unwrap();
    let overrides = text(&overrides.stdout);
    assert!(
        !overrides.contains("benchlink"),
        "overrides left: {overrides}"
    );
    stdout_of(&root, &["getent", "passwd", "benchlink-edge"]);

    eprintln!(
        "packages: built and linted in {:.0} s, installed in {:.0} s, whole test {:.0} s",
        packaged.as_secs_f64(),
        installed.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
