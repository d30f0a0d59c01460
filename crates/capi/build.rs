//! Gives the shared library the name C programs link against.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libugds.so");
}
