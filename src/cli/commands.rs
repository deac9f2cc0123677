//! What `bench` does for each command: a run (in this process, as a sweep of child
//! processes or as parallel ranks), `verify`, `env`, `dist-check`; and the tables it prints.

use super::plan::{check_parallel, parallel, plan, resolve_config, Parallel, Plan, RunConfig};
use super::{DistCheckArgs, EnvArgs, RunArgs, VerifyArgs};
use crate::env::EnvReport;
use crate::error::{Error, Result};
use crate::launch::ranks::{run_ranks, Meeting};
use crate::launch::sweep::{run_sweep, ChildTask, SweepOptions};
use crate::log::RunOutcome;
use crate::record::Summary;
use crate::report::console::{
    generate_side_by_side, side_by_side, summary_table, sweep_table, train_side_by_side,
    train_sweep_table, train_table,
};
use crate::report::console_serving::{serving_sweep_table, serving_table};
use crate::scenarios::generate::Generation;
use crate::scenarios::lambada::Lambada;
use crate::scenarios::serving::Serving;
use crate::scenarios::skeleton::{self, TimedRun};
use crate::scenarios::train::{prepare::prepare, Training};
use crate::scenarios::verify::verify;
use crate::scenarios::{DpRun, RunSpec, Workload};
use std::process::ExitCode;

/// Exit 0, or 1 when a check failed (the engines disagree, a sweep run failed).
pub fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `bench [RUN OPTIONS]`: a parallel run, a sweep child, a sweep, or one run.
pub fn run_command(args: RunArgs, command_line: Vec<String>) -> Result<ExitCode> {
    // The run's spec carries `--fused` and the candle engine switches it on as it opens; set
    // here too because a parallel run's ranks map their one-shot sums' buffers (and name the
    // backend in the log) when they join, before any engine opens.
    crate::kernels::set_enabled(&args.fused);
    let plan = plan(&args)?;
    // A sweep's child runs the configuration it was given (with --strategies, as the launcher
    // of its ranks, or as one of them: the ranks inherit the task).
    let task = ChildTask::from_env()?;
    let plan = match &task {
        Some(t) => plan.only(RunConfig::from_record(&t.config)?),
        None if plan.sweep => return sweep(args, plan, command_line),
        None => plan,
    };
    if let Some(par) = parallel(&args, &plan)? {
        return run_parallel(args, plan, par, task, command_line);
    }
    single(child_spec(&args, &plan, task, command_line)?)
}

/// The spec of the plan's one configuration; a sweep child's logs into the sweep's folder,
/// with its repeat number, and shows no progress bar.
fn child_spec(
    args: &RunArgs,
    plan: &Plan,
    task: Option<ChildTask>,
    command_line: Vec<String>,
) -> Result<RunSpec> {
    let repeat = task.as_ref().map(|t| t.repeat);
    let mut spec = resolve_config(args, plan, &plan.configs[0], repeat, command_line)?;
    if let Some(t) = task {
        spec.log_dir = t.log_dir;
        spec.progress = false;
    }
    Ok(spec)
}

/// Runs a sweep: checks every configuration resolves (a typo fails before any child starts),
/// then hands them to [`run_sweep`].
fn sweep(args: RunArgs, plan: Plan, command_line: Vec<String>) -> Result<ExitCode> {
    if args.save_weights.is_some() {
        return Err(Error::Config(
            "--save-weights writes one model: run it without a sweep".into(),
        ));
    }
    // --tp / --dp runs one configuration, unless --strategies makes each a group of ranks,
    // or the serving suite's rates do (each child launches its --tp ranks, as --strategies';
    // its own checks refuse --dp).
    let serving = plan.suite.serving.is_some();
    if (args.tp > 1 || args.dp > 1) && args.strategies.is_empty() && !serving {
        let flag = if args.tp > 1 { "--tp" } else { "--dp" };
        return Err(Error::Config(format!(
            "{flag} is not supported in a sweep (one configuration at a time; --repeat and --isolate included); --strategies sweeps --dp runs, the serving suite's rates --tp runs"
        )));
    }
    // Every configuration, so that a missing llm.c binary fails before candle trains; a serving
    // sweep over --tp also checks each child's ranks (engine, model split, device) up front.
    for config in &plan.configs {
        let spec = resolve_config(&args, &plan, config, None, vec![])?;
        if serving && args.tp > 1 {
            if let Some(par) = parallel(&args, &plan.one_of(config))? {
                check_parallel(par, &spec)?;
            }
        }
    }
    let outcome = run_sweep(SweepOptions {
        suite: plan.suite.name.clone(),
        device: plan.device.to_string(),
        configs: plan.configs.iter().map(RunConfig::record).collect(),
        repeat: plan.repeat,
        log_dir: args.log_dir.clone(),
        sweep_dir: args.sweep_dir.clone(),
        resume: args.resume,
        run_timeout: args
            .run_timeout
            .map(|s| std::time::Duration::from_secs_f64(s.max(0.))),
        progress: !args.no_progress,
        child_args: command_line.iter().skip(1).cloned().collect(),
        command_line,
    })?;
    print!("{}", sweep_table(&outcome));
    print!("{}", train_sweep_table(&outcome));
    print!("{}", serving_sweep_table(&outcome));
    Ok(exit(outcome.succeeded()))
}

/// `--tp N` / `--dp N`: this process as one rank, or the launcher of all of them.
fn run_parallel(
    args: RunArgs,
    plan: Plan,
    par: Parallel,
    task: Option<ChildTask>,
    command_line: Vec<String>,
) -> Result<ExitCode> {
    let spec = child_spec(&args, &plan, task, command_line)?;
    check_parallel(par, &spec)?;
    let spec_device = spec.device;
    let timeout = std::time::Duration::from_secs(args.rdzv_timeout);
    let run = move |ctx| {
        single(match par {
            Parallel::Tensor(_) => RunSpec {
                tp: Some(ctx),
                ..spec
            },
            Parallel::Data { zero, overlap, .. } => RunSpec {
                dp: Some(DpRun { ctx, zero, overlap }),
                ..spec
            },
        })
    };
    let meeting = Meeting {
        timeout,
        progress: !args.no_progress,
    };
    run_ranks(par.size(), par.flag(), spec_device, meeting, Box::new(run))
}

/// `--acc-threshold X`: every engine's accuracy at least X (FasterTransformer's CI gate);
/// says which fell short.
fn accuracy_gate(threshold: Option<f64>, outcomes: &[RunOutcome<Summary>]) -> bool {
    let Some(x) = threshold else { return true };
    let mut ok = true;
    // NaN (no passage finished) fails the gate too.
    let below = |a: f64| a.partial_cmp(&x).is_none_or(|o| o.is_lt());
    for out in outcomes.iter().filter(|o| below(o.summary.accuracy)) {
        eprintln!(
            "accuracy {:.4} of {} is below --acc-threshold {x}",
            out.summary.accuracy, out.header.engine
        );
        ok = false;
    }
    ok
}

/// One configuration, in this process: a plain run, a sweep's child ([`ChildTask`]) or one
/// rank of a parallel run (only rank 0 prints).
fn single(spec: RunSpec) -> Result<ExitCode> {
    let print = spec.is_logging_rank();
    match &spec.workload {
        Workload::Train(opts) => {
            let prep = prepare(&spec, opts)?;
            let outcomes = skeleton::run(&spec, &Training { opts, prep: &prep })?;
            if !print {
                return Ok(ExitCode::SUCCESS);
            }
            for out in &outcomes {
                print!("{}", train_table(&out.header, &out.summary, &out.log_path));
            }
            if let [candle, hf] = outcomes.as_slice() {
                let (table, agree) = train_side_by_side(candle, hf);
                print!("{table}");
                return Ok(exit(agree));
            }
        }
        Workload::Generate(opts) => {
            let outcomes = skeleton::run(&spec, &TimedRun(Generation(opts)))?;
            if !print {
                return Ok(ExitCode::SUCCESS);
            }
            for out in &outcomes {
                print!(
                    "{}",
                    summary_table(&out.header, &out.summary, &out.log_path)
                );
            }
            if let [candle, hf] = outcomes.as_slice() {
                print!("{}", generate_side_by_side(candle, hf));
            }
            return Ok(exit(accuracy_gate(opts.acc_threshold, &outcomes)));
        }
        Workload::Serve(opts) => {
            let outcomes = skeleton::run(&spec, &Serving(opts))?;
            for out in outcomes.iter().filter(|_| print) {
                print!(
                    "{}",
                    serving_table(&out.header, &out.summary, &out.log_path)
                );
            }
        }
        Workload::Score => {
            let outcomes = skeleton::run(&spec, &TimedRun(Lambada))?;
            if !print {
                return Ok(ExitCode::SUCCESS);
            }
            for out in &outcomes {
                print!(
                    "{}",
                    summary_table(&out.header, &out.summary, &out.log_path)
                );
            }
            if let [candle, hf] = outcomes.as_slice() {
                let (table, agree) = side_by_side(candle, hf);
                print!("{table}");
                return Ok(exit(agree));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run_verify(args: VerifyArgs) -> Result<bool> {
    let report = verify(&args.model_dir, args.device, args.dtype, args.batch_size)?;
    println!(
        "verify {} on {} in {}",
        args.model_dir.display(),
        args.device,
        args.dtype
    );
    let mut ok = true;
    let tol = args.tolerance;
    if let Some(l) = &report.logits {
        println!(
            "  logits: {} positions, max |Δ| {:.3e}, max |ref| {:.3}, max rel err {:.3e}",
            l.n_positions, l.max_abs_err, l.max_abs_ref, l.max_rel_err
        );
        ok &= tol.is_none_or(|t| l.max_rel_err <= t);
    }
    if let Some(c) = &report.lambada {
        println!(
            "  lambada: {} passages, tokens equal {}/{}, ll max |Δ| {:.3e} (rel {:.3e}), greedy equal {}/{} (ours {}, ref {})",
            c.n_passages,
            c.tokens_equal,
            c.n_passages,
            c.ll_max_abs_err,
            c.ll_max_rel_err,
            c.greedy_equal,
            c.n_passages,
            c.greedy_ours,
            c.greedy_ref
        );
        ok &= c.tokens_equal == c.n_passages && tol.is_none_or(|t| c.ll_max_rel_err <= t);
    }
    println!(
        "  json: {}",
        serde_json::to_string(&report).expect("report serializes")
    );
    Ok(ok)
}

pub fn run_env(args: EnvArgs) -> Result<bool> {
    if args.check_trackers {
        print!("{}", crate::trackers::check_trackers(args.device)?);
        return Ok(true);
    }
    let report = EnvReport::collect();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serializes")
        );
    } else {
        print!("{}", report.to_text());
    }
    Ok(!report.has_errors())
}

/// `bench dist-check`: as a rank (launcher variables set), meet the others and report; else
/// start `--nproc` ranks of this same command.
pub fn run_dist_check(a: DistCheckArgs) -> Result<()> {
    use crate::dist::{Peer, Rendezvous, World};
    use crate::launch::spawn::spawn_ranks;
    use std::time::Duration;
    let Some(world) = World::from_env()? else {
        if a.nproc == 0 {
            return Err(Error::Config("--nproc must be at least 1".into()));
        }
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        spawn_ranks(a.nproc, &args)?;
        println!(
            "dist-check: {} ranks met, agreed on the id and finished",
            a.nproc
        );
        return Ok(());
    };
    let me = Peer {
        rank: world.rank,
        host: gethostname::gethostname().to_string_lossy().into_owned(),
        pid: std::process::id(),
        info: serde_json::json!({ "local_rank": world.local_rank }),
    };
    let timeout = Duration::from_secs(a.rdzv_timeout);
    // The id rank 0 hands out: random bytes here (NCCL's unique id in a parallel run).
    let make_id = || Ok((0..128).map(|_| rand::random::<u8>()).collect());
    let rdzv = Rendezvous::join(&world, me, make_id, timeout, true)?;
    let digest = crate::data::sha256_hex(&rdzv.id);
    println!(
        "rank {}/{} ({:?}): id sha256 {} from rank 0, ranks {:?}",
        world.rank,
        world.size,
        world.launcher,
        &digest[..16],
        rdzv.peers.iter().map(|p| p.rank).collect::<Vec<_>>()
    );
    // Test hook: this rank dies right after the rendezvous, as a crashed rank would.
    if std::env::var("BENCH_DIST_CHECK_DIE").ok() == Some(world.rank.to_string()) {
        std::process::exit(3);
    }
    std::thread::sleep(Duration::from_millis(a.work_ms));
    rdzv.finish(timeout)
}
