//! Names the library as cuFile programs load it, and exports cuFile's API
//! alone (not the uGDS entry points of the library it is built on).
fn main() {
    let map = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("exports.map");
    println!("cargo:rerun-if-changed={}", map.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcufile.so.0");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", map.display());
}
