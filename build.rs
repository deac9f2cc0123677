// Bakes the git commit into the binary, so every run log names the code that produced it.
use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=TB_GIT_COMMIT={commit}{suffix}");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/index");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    println!("cargo:rerun-if-env-changed=CUDARC_CUDA_VERSION");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        compile_fused_kernels();
    }
}

/// src/kernels/fused.cu -> $OUT_DIR/fused.ptx (embedded by src/kernels/mod.rs). PTX for the
/// compute capability in CUDA_COMPUTE_CAP (as candle's kernels; default 80, the first with
/// bf16), compiled by the driver at first use.
fn compile_fused_kernels() {
    let src = "src/kernels/fused.cu";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("fused.ptx");
    let status = Command::new("nvcc")
        .args(["--ptx", "-O3", "-std=c++17", &format!("-arch=compute_{cap}"), src, "-o"])
        .arg(&out)
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run nvcc ({e}): the cuda feature needs a CUDA toolkit on PATH (README, CUDA build)")
        });
    assert!(status.success(), "nvcc failed on {src}");
}
