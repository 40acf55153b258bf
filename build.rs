//! Link settings of the `parlor` binary.

fn main() {
    let linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    let pie = std::env::var_os("CARGO_FEATURE_PIE").is_some();
    if linux && !pie {
        // A position-dependent executable: its constant tables of pointers (vtables, static
        // slices; 2.1 MiB) are final in the file, so they stay clean pages read in on use,
        // where a PIE's loader writes every page of them at start and they stay resident
        // (docs/perf.md: idle RSS). The code is still compiled position-independent; only
        // the link fixes its address. `--features pie` links a PIE (ASLR for the binary's
        // own code too) for 2 MiB more at idle.
        println!("cargo:rustc-link-arg-bins=-no-pie");
    } else if linux && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu") {
        // Relative relocations packed (DT_RELR) instead of 24 bytes each: the PIE binary has
        // about 64,000 of them, 1.5 MiB the loader would read at every start. Needs GNU ld
        // >= 2.38 (or lld) to link and glibc >= 2.36 to run: Debian 12, Ubuntu 22.10 and
        // later.
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
