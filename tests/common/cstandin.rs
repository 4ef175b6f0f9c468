//! Builds a C stand-in of a vendor library (tests/nvml_abi, tests/dcgm_abi) into a shared object,
//! once per test process. Included by path from those tests (`#[path] mod cstandin;`), so it uses
//! nothing but std.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles `src` (relative to the crate root) with `$CC` (default `cc`) into
/// `$CARGO_TARGET_TMPDIR/<dir>/<soname>`, with `soname` as its ELF soname and `extra` arguments
/// after the source (libraries). Several test processes may build at once: each compiles to its
/// own file and renames it into place. Returns the library's path; panics naming the compiler and
/// the source when the build fails.
pub fn build(dir: &str, src: &str, soname: &str, extra: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(dir);
    std::fs::create_dir_all(&dir).expect("create the stand-in's build directory");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let tmp = dir.join(format!("{soname}.{}.tmp", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args([
            "-shared", "-fPIC", "-O1", "-std=c11", "-Wall", "-Wextra", "-Werror",
        ])
        .arg("-fvisibility=hidden")
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .args(extra)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run the C compiler `{cc}` to build {}: {e} (install gcc, or set CC)",
                src.display()
            )
        });
    assert!(
        out.status.success(),
        "building {} with `{cc}` failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let lib = dir.join(soname);
    std::fs::rename(&tmp, &lib).expect("install the stand-in");
    lib
}
