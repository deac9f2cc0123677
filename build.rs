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

/// The kernel families of src/kernels: each `<name>.cu` -> `$OUT_DIR/<name>.ptx`, embedded by
/// src/kernels/<name>.rs (`ptx!`) and loaded as its own module.
const KERNELS: [&str; 19] = [
    "adamw",
    "argmax",
    "attn_softmax",
    "bias_act",
    "cross_entropy",
    "decode_attention",
    "decode_step",
    "dropout",
    "embedding",
    "flash_attn",
    "flash_prefill",
    "fp8",
    "gemv",
    "heads",
    "layer_norm",
    "multi_tensor",
    "oneshot",
    "residual",
    "skinny",
];
/// The headers those `.cu` files include.
const HEADERS: [&str; 5] = [
    "common.cuh",
    "dropout.cuh",
    "flash_tiles.cuh",
    "gemv.cuh",
    "mma.cuh",
];

/// PTX for the compute capability in CUDA_COMPUTE_CAP (as candle's kernels; default 80, the
/// first with bf16), compiled by the driver at first use.
fn compile_fused_kernels() {
    for h in HEADERS {
        println!("cargo:rerun-if-changed=src/kernels/{h}");
    }
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    // pdl.rs starts kernels early only where their PTX has the wait (compute 90 and up).
    println!("cargo:rustc-env=TB_PTX_CAP={cap}");
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    for name in KERNELS {
        let src = format!("src/kernels/{name}.cu");
        println!("cargo:rerun-if-changed={src}");
        let status = Command::new("nvcc")
            .args(["--ptx", "-O3", "-std=c++17", &format!("-arch=compute_{cap}"), &src, "-o"])
            .arg(out_dir.join(format!("{name}.ptx")))
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run nvcc ({e}): the cuda feature needs a CUDA toolkit on PATH (docs/environment.md, CUDA build)")
            });
        assert!(status.success(), "nvcc failed on {src}");
    }
}
