//! Link settings of the `parlor` binary.

fn main() {
    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if linux_gnu {
        // Relative relocations packed (DT_RELR) instead of 24 bytes each: the PIE binary has
        // about 64,000 of them, 1.5 MiB the loader reads at every start and that stay
        // resident (docs/perf.md: idle RSS). Needs GNU ld >= 2.38 (or lld) to link and
        // glibc >= 2.36 to run: Debian 12, Ubuntu 22.10 and later.
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
