//! The PTX of the decode kernels that programmatic edges start early (`--fused pdl`,
//! kernels::pdl): each waits for the kernel before it before touching memory, but the early
//! GEMVs' weight loads. Reads build.rs's PTX only: no GPU work, but the PTX exists in CUDA
//! builds only.

/// Every kernel that a programmatic edge may start early (kernels::pdl::waits_first) waits for
/// the kernel before it first: in its PTX, `griddepcontrol.wait` is in the entry block (no
/// branch, return, call or label before it) and comes before any access to memory but the
/// kernel's parameters; and every name prefix of the list names kernels. The early GEMVs
/// (kernels::pdl::weights_first) may also load before it, but only at addresses computed from
/// their weight (parameter 1), never from x, the bias or the output. The cache-first
/// attention kernels (kernels::pdl::cache_first) have one wait, and before it only loads from
/// the caches, the mask, the positions and the cursor, never from qkv or the output, and no
/// store (branches allowed).
#[test]
fn the_kernels_started_early_wait_before_any_memory_access() {
    use crate::kernels::pdl::{cache_first, waits_first, weights_first, CACHE_FIRST};
    use crate::kernels::pdl::{WAITS_FIRST, WEIGHTS_FIRST};
    let families = [
        include_str!(concat!(env!("OUT_DIR"), "/gemv.ptx")),
        include_str!(concat!(env!("OUT_DIR"), "/fp8.ptx")),
        include_str!(concat!(env!("OUT_DIR"), "/skinny.ptx")),
        include_str!(concat!(env!("OUT_DIR"), "/argmax.ptx")),
        include_str!(concat!(env!("OUT_DIR"), "/layer_norm.ptx")),
        include_str!(concat!(env!("OUT_DIR"), "/decode_attention.ptx")),
        include_str!(concat!(env!("OUT_DIR"), "/embedding.ptx")),
    ];
    let mut checked = Vec::new();
    for entry in families.iter().flat_map(|ptx| ptx.split(".entry ").skip(1)) {
        let name = entry.split('(').next().unwrap().trim();
        let early = match (cache_first(name), weights_first(name), waits_first(name)) {
            (true, _, _) => Early::Cache,
            (_, true, _) => Early::Weights,
            (_, _, true) => Early::Nothing,
            _ => continue,
        };
        let wait = entry
            .find("griddepcontrol.wait")
            .unwrap_or_else(|| panic!("{name}: no wait"));
        let waits = entry.matches("griddepcontrol.wait").count();
        assert!(early != Early::Cache || waits == 1, "{name}: {waits} waits");
        let body = entry[..wait].split_once('{').map_or("", |(_, b)| b);
        let early_loads = check_before_wait(name, body, early);
        if early != Early::Nothing {
            assert!(early_loads > 0, "{name}: nothing loaded before the wait");
        }
        checked.push(name.to_string());
    }
    for prefix in WAITS_FIRST.iter().chain(WEIGHTS_FIRST).chain(CACHE_FIRST) {
        let any = checked.iter().any(|n| n.starts_with(prefix));
        assert!(any, "no kernel named {prefix}… in the PTX");
    }
}

/// What a kernel may load before its wait.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Early {
    /// Its parameters only.
    Nothing,
    /// Its weights (parameter 1), in streaming loads, without control flow.
    Weights,
    /// The decode attention's caches, mask, positions and cursor (parameters 4, 5, 6, 8, 15),
    /// never qkv (0) or the output (9); branches allowed.
    Cache,
}

/// Checks the PTX `body` of kernel `name` before its wait: no memory access but parameter
/// loads and the global loads `early` allows. Returns the number of those.
fn check_before_wait(name: &str, body: &str, early: Early) -> usize {
    use std::collections::{BTreeSet, HashMap};
    let branches = early == Early::Cache;
    // Which parameters each register's value was computed from.
    let mut from: HashMap<&str, BTreeSet<u32>> = HashMap::new();
    let mut loads = 0;
    for l in body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with('.'))
    {
        // An instruction after its predicate, if any ("@%p1 ld.global…").
        let op = match l.strip_prefix('@') {
            Some(rest) => rest.split_once(char::is_whitespace).map_or("", |(_, r)| r),
            None => l,
        };
        if control_flow(name, l, op, branches) {
            continue;
        }
        let (opcode, operands) = op.split_once(char::is_whitespace).unwrap_or((op, ""));
        let (dest, srcs) = split_dest(operands);
        if opcode.starts_with("ld.param") {
            let idx = srcs.rsplit("_param_").next().unwrap_or("");
            let idx: u32 = idx
                .trim_end_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .unwrap();
            from.insert(dest.trim(), BTreeSet::from([idx]));
            continue;
        }
        if opcode.starts_with("ld.") {
            let addr = srcs.split_once('[').and_then(|(_, a)| a.split_once(']'));
            let roots: BTreeSet<u32> = regs(addr.map_or("", |(a, _)| a))
                .iter()
                .flat_map(|r| from.get(r).cloned().unwrap_or_default())
                .collect();
            assert!(
                early_load(early, opcode, &roots),
                "{name}: `{l}` reads {roots:?}"
            );
            // What it loaded is the cursor or a position: later addresses derive from it.
            for d in regs(dest) {
                from.entry(d).or_default().extend(roots.iter().copied());
            }
            loads += 1;
            continue;
        }
        // Any other instruction: its destinations computed from its sources (accumulated
        // where branches may assign a register on two paths).
        let roots: BTreeSet<u32> = regs(srcs)
            .iter()
            .flat_map(|r| from.get(r).cloned().unwrap_or_default())
            .collect();
        for d in regs(dest) {
            match branches {
                true => from.entry(d).or_default().extend(roots.iter().copied()),
                false => drop(from.insert(d, roots.clone())),
            }
        }
    }
    loads
}

/// Whether the instruction `op` (line `line` of kernel `name`, before its wait) is a branch
/// or a label, which only `branches` allows; fails on one that accesses memory otherwise than
/// by a load, or synchronises.
fn control_flow(name: &str, line: &str, op: &str, branches: bool) -> bool {
    const FORBIDDEN: [&str; 15] = [
        "ldu.",
        "st.",
        "atom.",
        "red.",
        "cp.",
        "prefetch",
        "tex.",
        "suld",
        "sust",
        "multimem.",
        "wmma.",
        "ret",
        "call",
        "exit",
        "bar.",
    ];
    // A cluster's arrival (no memory access) may come first; its wait may not.
    let arrive = op.starts_with("barrier.cluster.arrive");
    let flow = op.starts_with("bra") || op.ends_with(':');
    let bad = FORBIDDEN.iter().any(|p| op.starts_with(p))
        || (op.starts_with("barrier.") && !arrive)
        || (flow && !branches);
    assert!(!bad, "{name}: `{line}` before the wait");
    flow
}

/// Whether a global load `opcode` at an address computed from parameters `roots` may come
/// before the wait of a kernel that loads `early` there.
fn early_load(early: Early, opcode: &str, roots: &std::collections::BTreeSet<u32>) -> bool {
    match early {
        Early::Nothing => false,
        // Streaming loads only: ptxas moves read-only (.nc) loads past the wait, so a kernel
        // loading its weights with __ldg loads them late (results/h200x2/gate-run108).
        // Parameters 0, 2, 3: x, the bias / scales, y (4-6: sizes and the act).
        Early::Weights => {
            let others = roots.iter().any(|p| [0, 2, 3].contains(p));
            opcode.starts_with("ld.global.cs.") && roots.contains(&1) && !others
        }
        // Plain or L2 loads (not read-only ones, which ptxas may move past the wait).
        Early::Cache => {
            let sources = roots.iter().any(|p| [4, 5, 6, 8, 15].contains(p));
            let forbidden = roots.contains(&0) || roots.contains(&9);
            let kept = opcode.starts_with("ld.global.") && !opcode.starts_with("ld.global.nc");
            kept && sources && !forbidden
        }
    }
}

/// PTX operands split after the destination: at the first comma outside braces, so that a
/// vector destination (`{%r1, %r2}, …`) stays whole.
fn split_dest(operands: &str) -> (&str, &str) {
    let mut depth = 0;
    for (i, c) in operands.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => return (&operands[..i], &operands[i + 1..]),
            _ => {}
        }
    }
    (operands, "")
}

/// The registers (`%r12`, `%rd3`, …) named in PTX operands `s`.
fn regs(s: &str) -> Vec<&str> {
    s.split(|c: char| !(c.is_alphanumeric() || c == '%' || c == '_'))
        .filter(|t| t.starts_with('%'))
        .collect()
}
