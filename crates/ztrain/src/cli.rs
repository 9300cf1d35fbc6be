//! The command line. Every option's help says what it does and its default; `Options::config`
//! turns them into a checked [`RunConfig`].

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use zgrad::{LrDecay, Precision, TrainSchedule, XAssetConfig};

use crate::arena_options::ArenaOptions;
use crate::config::{DataSource, LR_DECAY_NAMES, RunConfig, SCHEDULE_NAMES, check_model};
use crate::error::{Result, TrainError};

/// Where the model trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceChoice {
    /// The GPU when one is usable (driver loads, a device opens), else the CPU; says which.
    Auto,
    /// The CPU backend (tensors in host memory; no device arena).
    Cpu,
    /// The CUDA backend on GPU 0; an error if there is no usable GPU.
    Cuda,
    /// The CUDA backend over the simulated driver (host memory, virtual clock): the whole
    /// device path (arena, step scopes, timeline) without a GPU. Slow; for small sizes.
    Sim,
}

/// Where the data set lives while the model trains (`--data-on`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DataOn {
    /// On the device when the run's memory plan plus the data set fit its memory with a
    /// margin (and the backend is a device), else on the host; says which.
    Auto,
    /// On the device: uploaded once, each step's rows gathered there by their indices; an
    /// error if it does not fit (saying how much is needed and free).
    Device,
    /// On the host: each step's rows copied and uploaded.
    Host,
}

/// How the ranks sum the gradient bucket backward finishes last (`--last-bucket`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LastBucket {
    /// Through the ranks' device memory, mapped into each other (CUDA IPC over NVLink), with
    /// the gradient norm in the same launch, where every rank can map every other's (one
    /// host); NCCL's all-reduce otherwise, which every rank then keeps.
    Peer,
    /// NCCL's all-reduce, then the norm in a launch of its own.
    Nccl,
}

/// Parses `--schedule` into zgrad's schedule (the command line spells it `batched` or
/// `per-sample`).
/// The `--precision` values, in the order the help lists them.
const PRECISIONS: [Precision; 3] = [Precision::F32, Precision::Tf32, Precision::Bf16];

fn precision_parser() -> impl clap::builder::TypedValueParser<Value = Precision> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(PRECISIONS.map(Precision::name)).map(|name: String| {
        PRECISIONS
            .into_iter()
            .find(|p| p.name() == name)
            .unwrap_or_default()
    })
}

fn schedule_parser() -> impl clap::builder::TypedValueParser<Value = TrainSchedule> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([
        PossibleValue::new(SCHEDULE_NAMES[0].0)
            .help("One forward and backward over the whole batch"),
        PossibleValue::new(SCHEDULE_NAMES[1].0).help(
            "Forward and backward per sample (loss / B), gradients accumulating, the step's \
             scratch memory reclaimed after every sample",
        ),
    ])
    .map(|name: String| {
        SCHEDULE_NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(TrainSchedule::Batched, |(_, s)| *s)
    })
}

/// Parses `--lr-schedule` into zgrad's decay (`constant` or `cosine`).
fn lr_decay_parser() -> impl clap::builder::TypedValueParser<Value = LrDecay> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([
        PossibleValue::new(LR_DECAY_NAMES[0].0).help("--lr throughout (after the warm-up)"),
        PossibleValue::new(LR_DECAY_NAMES[1].0)
            .help("Half-cosine decay from --lr to 0 over the run's steps (after the warm-up)"),
    ])
    .map(|name: String| {
        LR_DECAY_NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(LrDecay::Constant, |(_, d)| *d)
    })
}

/// The exit statuses, in `--help` and docs/ztrain.md.
pub const EXIT_CODES: &str = "Exit status: 0 the run finished (or stopped at --stop-after); 1 an \
error (the message says what to do); 2 bad command-line usage; 130 stopped by SIGINT (Ctrl-C), \
143 by SIGTERM: the current step finishes, the checkpoint is written if --checkpoint was \
given, the summary is printed; a second signal exits at once with the same status.";

/// Train the XAsset model (docs/xasset.md) on a CSV file or on a deterministic synthetic
/// data set, and report loss, accuracy, speed and memory.
///
/// With no options: the default model size on the synthetic data, on the GPU when one is usable
/// and on the CPU otherwise.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "ztrain",
    version,
    about,
    long_about,
    max_term_width = 100,
    args_override_self = true,
    after_help = EXIT_CODES
)]
pub struct Options {
    /// Where to train: auto, cpu, cuda, or sim (the CUDA backend on the simulated driver).
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto, help_heading = "Device")]
    pub device: DeviceChoice,

    /// Memory of the simulated device for --device sim (K/M/G suffixes).
    #[arg(long, default_value = "4G", value_parser = parse_size, help_heading = "Device")]
    pub sim_memory: u64,

    /// Virtual time, in seconds, that every operation queued on the simulated device takes
    /// (--device sim): larger makes a slower device, whose steps take seconds of its clock
    /// (what paces the read-backs of several ranks) while the host runs at full speed.
    #[arg(
        long,
        default_value_t = 0.000_005,
        value_name = "SECONDS",
        help_heading = "Device"
    )]
    pub sim_op_time: f64,

    /// Data-parallel ranks on this host: the program starts itself N times, one process per GPU
    /// (LOCAL_RANK picks the GPU), or per simulated device with --device sim; --batch stays
    /// the global batch, split over the ranks. Started by torchrun, SLURM or mpirun instead
    /// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set), it joins as that rank.
    /// Exit status 100 + r when rank r failed (the message says why).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=99), help_heading = "Device")]
    pub gpus: u16,

    /// Writes a new random job secret (256 bits as hex digits) to FILE, created with mode 0600
    /// and never overwritten, and exits: give it to every rank of a job started by another
    /// launcher as ZCOMM_SECRET_FILE=FILE. One secret per job: two jobs that share one can
    /// be spliced together.
    #[arg(long, value_name = "FILE", help_heading = "Device")]
    pub make_secret: Option<PathBuf>,

    /// Longest wait, in seconds, for the other ranks (the rendezvous, every collective): a
    /// rank that stalls or dies makes the others stop with an error naming it after this.
    #[arg(
        long,
        default_value_t = 120.0,
        value_name = "SECONDS",
        help_heading = "Device"
    )]
    pub comm_timeout: f64,

    /// With several ranks: MiB of gradient per bucket of the all-reduce that runs on a second
    /// stream while backward goes on (each bucket as soon as backward has finished it; the last
    /// ones, which backward finishes at its end, smaller); 0 sums the whole gradient once after
    /// backward instead.
    #[arg(
        long,
        default_value_t = 1.0,
        value_name = "MIB",
        help_heading = "Device"
    )]
    pub bucket_mib: f64,

    /// With several ranks started by --gpus: the most NCCL channels (thread blocks, each on an
    /// SM) a collective takes, passed to the ranks as NCCL_MAX_NCHANNELS unless that or
    /// NCCL_MAX_CTAS is already set; 0 (the default) leaves NCCL's own choice. An all-reduce
    /// overlapped with backward waits for SMs that backward's kernels hold; on 2 H100s (NVLink)
    /// 8 channels summed XAsset's 3.4 MB 15% faster than NCCL's choice, but made no steady
    /// difference to the overlapped step (docs/benchmarks.md).
    #[arg(long, default_value_t = 0, value_name = "N", help_heading = "Device")]
    pub nccl_channels: u32,

    /// With several ranks on GPUs: the most thread blocks (each on an SM) a gradient bucket's
    /// all-reduce overlapped with backward takes. The overlapped buckets then run on a second
    /// NCCL communicator split from the first; the last bucket, summed after backward, keeps
    /// the first (NCCL's choice). 0 (the default): one communicator. Helps where backward is
    /// long enough for few blocks (docs/benchmarks.md).
    #[arg(long, default_value_t = 0, value_name = "N", help_heading = "Device")]
    pub overlap_ctas: u32,

    /// With several ranks on GPUs: how the gradient bucket backward finishes last is summed.
    /// Every rank waits for that sum after backward, then takes the gradients' norm; `peer`
    /// does both in one launch (ranks of one host; every rank keeps NCCL if any cannot map
    /// the others' memory); measured faster than `nccl` on 2 H100s (docs/benchmarks.md).
    #[arg(long, value_enum, default_value_t = LastBucket::Peer, help_heading = "Device")]
    pub last_bucket: LastBucket,

    /// Train on this file instead of synthetic data, its format from its extension: .csv (a
    /// header row, then per sample S·F feature columns, column = s·F + f, and a 0/1 label),
    /// .parquet or .arrow/.feather (the same columns, names free), .npz (arrays x of shape (N, S, F)
    /// and y of (N,)), .npy (x; y with --labels) or .safetensors (tensors x and y). See docs/ztrain.md.
    #[arg(long, value_name = "FILE", help_heading = "Data")]
    pub data: Option<PathBuf>,

    /// With a features .npy as --data: the labels' .npy (y of shape (N,) or (N, 1), 0/1).
    #[arg(
        long,
        value_name = "FILE.npy",
        requires = "data",
        help_heading = "Data"
    )]
    pub labels: Option<PathBuf>,

    /// Leave the --data samples in their file and read each batch's rows as it is staged: by
    /// position (a .npy pair, .safetensors or an .npz of stored members, C order), by row
    /// group (.parquet, a column chunk's pages at a time), by record batch (.arrow) or by a
    /// row index built in one pass (.csv): the host holds one batch (and the reader's bound),
    /// whatever the file's size; bitwise the run that reads the file whole. Any model of one
    /// target value a sample, with --gpus N each rank reading its shard; the training set on
    /// the host, no --window; --normalize reads the training rows through once first.
    #[arg(
        long,
        requires = "data",
        conflicts_with = "window",
        help_heading = "Data"
    )]
    pub stream: bool,

    /// --data is a table of bars (one row per time step: F feature columns, then the label;
    /// .csv, .parquet or .arrow): cut windows of this many bars (S, replacing --scales) as
    /// training runs, each labelled by its last bar. The series is stored once. Validation
    /// is the last --validate-fraction of the windows, every bar after the training bars.
    #[arg(long, value_name = "S", requires = "data", help_heading = "Data")]
    pub window: Option<usize>,

    /// With --window: bars left out between the last training bar and the first validation
    /// bar.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        requires = "window",
        help_heading = "Data"
    )]
    pub gap: usize,

    /// Normalise every feature by the mean and standard deviation of the training part only
    /// (per feature column; with --window over the training bars), applied to the validation
    /// part too; the statistics are stored in the checkpoint's configuration.
    #[arg(long, help_heading = "Data")]
    pub normalize: bool,

    /// Size of the synthetic data set (train and validation together).
    #[arg(long, default_value_t = 10_240, help_heading = "Data")]
    pub samples: usize,

    /// Seed of the synthetic data set (independent of --seed).
    #[arg(long, default_value_t = 1, help_heading = "Data")]
    pub data_seed: u64,

    /// Fraction of the samples (the last rows) held out for validation, in [0, 1).
    #[arg(long, default_value_t = 0.2, help_heading = "Data")]
    pub validate_fraction: f64,

    /// Scales per sample (S).
    #[arg(
        long,
        default_value_t = 12,
        help_heading = "Model (docs/xasset.md; defaults are its size)"
    )]
    pub scales: usize,

    /// Features per scale (F).
    #[arg(
        long,
        default_value_t = 193,
        help_heading = "Model (docs/xasset.md; defaults are its size)"
    )]
    pub features: usize,

    /// Model width (D); a multiple of --heads.
    #[arg(
        long,
        default_value_t = 256,
        help_heading = "Model (docs/xasset.md; defaults are its size)"
    )]
    pub width: usize,

    /// Attention heads (H); head width is D / H.
    #[arg(
        long,
        default_value_t = 4,
        help_heading = "Model (docs/xasset.md; defaults are its size)"
    )]
    pub heads: usize,

    /// Feed-forward width (FF).
    #[arg(
        long,
        default_value_t = 1024,
        help_heading = "Model (docs/xasset.md; defaults are its size)"
    )]
    pub ff: usize,

    /// Encoder blocks (L; docs/xasset.md "Depth"): 1 is the reference model, 3 the real
    /// cross-asset one. Parameters are named blocks.{i}.* when L > 1.
    #[arg(
        long,
        default_value_t = 1,
        help_heading = "Model (docs/xasset.md; defaults are its size)"
    )]
    pub layers: usize,

    /// Passes over the training samples.
    #[arg(long, default_value_t = 2, help_heading = "Training")]
    pub epochs: usize,

    /// Samples per optimiser step (B). The last batch of an epoch may be smaller.
    #[arg(long, default_value_t = 256, help_heading = "Training")]
    pub batch: usize,

    /// Peak learning rate of AdamW.
    #[arg(long, default_value_t = 1e-3, help_heading = "Training")]
    pub lr: f64,

    /// How the learning rate moves over the run.
    #[arg(long, value_parser = lr_decay_parser(), default_value = "constant", help_heading = "Training")]
    pub lr_schedule: LrDecay,

    /// Steps of linear warm-up from 0 to --lr before the schedule starts.
    #[arg(long, default_value_t = 0, help_heading = "Training")]
    pub warmup_steps: u64,

    /// AdamW weight decay (applied to every parameter, as docs/xasset.md); with --optimizer
    /// sgd, SGD's (coupled, L2) weight decay.
    #[arg(long, default_value_t = 0.01, help_heading = "Training")]
    pub weight_decay: f64,

    /// The optimiser: adamw, or sgd (torch.optim.SGD: --momentum, --nesterov).
    #[arg(long, value_parser = ["adamw", "sgd"], default_value = "adamw", help_heading = "Training")]
    pub optimizer: String,

    /// SGD's momentum factor (0: plain SGD). Only with --optimizer sgd.
    #[arg(long, default_value_t = 0.0, help_heading = "Training")]
    pub momentum: f64,

    /// SGD with Nesterov momentum (needs --momentum above 0). Only with --optimizer sgd.
    #[arg(long, help_heading = "Training")]
    pub nesterov: bool,

    /// Scale gradients down so their global L2 norm is at most this (off when absent).
    #[arg(long, value_name = "NORM", help_heading = "Training")]
    pub clip_grad: Option<f64>,

    /// batched: one forward/backward per batch; per-sample: one per sample, gradients
    /// accumulated, scratch memory reclaimed after every sample.
    #[arg(long, value_parser = schedule_parser(), default_value = "batched", help_heading = "Training")]
    pub schedule: TrainSchedule,

    /// Capture the training step once and replay it (a CUDA graph on the GPU; the recorded
    /// step on the CPU). Results equal the eager run.
    #[arg(long, help_heading = "Training")]
    pub capture: bool,

    /// The training step's precision policy (docs/precision.md): f32 (everything float32),
    /// tf32 (matrix products on TF32 tensor cores) or bf16 (matrix products with bf16 inputs
    /// and float32 accumulation). Parameters, AdamW, norms, softmax, losses and evaluation stay
    /// float32. A backend that cannot run the policy is refused, never run in float32.
    #[arg(long, value_parser = precision_parser(), default_value = "f32", help_heading = "Training")]
    pub precision: Precision,

    /// Where the data set lives: auto, device (uploaded once, each step's shuffled rows
    /// gathered on the device inside the step) or host (rows copied and uploaded every step).
    #[arg(long, value_enum, default_value_t = DataOn::Auto, help_heading = "Training")]
    pub data_on: DataOn,

    /// Read the steps' loss and gradient norm back every this many steps (one wait on the
    /// device each time; the batched schedule, data on the device or staged from the host):
    /// the progress bar moves, and a non-finite step is reported by its number and stops the
    /// run, within this many steps.
    /// Checkpoints, --stop-after and signals stay exact (they read back first).
    #[arg(
        long,
        value_name = "STEPS",
        default_value_t = 32,
        help_heading = "Training"
    )]
    pub readback_every: usize,

    /// Seed of the parameter initialisation and of the data order.
    #[arg(long, default_value_t = 0, help_heading = "Training")]
    pub seed: u64,

    /// The device-memory (arena) options.
    #[command(flatten)]
    pub arena: ArenaOptions,

    /// Write a checkpoint here at the end of every epoch, every --checkpoint-every steps, and
    /// at the end of the run (atomically: a temporary file, then a rename).
    #[arg(long, value_name = "FILE", help_heading = "Checkpoints")]
    pub checkpoint: Option<PathBuf>,

    /// Also write the checkpoint every this many optimiser steps.
    #[arg(
        long,
        value_name = "STEPS",
        requires = "checkpoint",
        help_heading = "Checkpoints"
    )]
    pub checkpoint_every: Option<u64>,

    /// Continue the run saved in this checkpoint (the options must match the ones it was
    /// written with; --epochs may be raised when --lr-schedule is constant). Ends bitwise equal to an uninterrupted run on the
    /// same device and backend.
    #[arg(long, value_name = "FILE", help_heading = "Checkpoints")]
    pub resume: Option<PathBuf>,

    /// Start from the parameters in this safetensors file (a PyTorch state_dict under
    /// docs/xasset.md's names, an oracle input, or a checkpoint's parameters) instead of a random
    /// initialisation: zero optimiser moments, step 0, as fine-tuning does. Its sizes and depth
    /// must be the options' (missing, extra or misshapen tensors are named).
    #[arg(
        long,
        value_name = "FILE.safetensors",
        conflicts_with = "resume",
        help_heading = "Checkpoints"
    )]
    pub init_from: Option<PathBuf>,

    /// Stop after this many optimiser steps in all (counting resumed ones), writing the
    /// checkpoint: splits a long run into pieces.
    #[arg(long, value_name = "STEPS", help_heading = "Checkpoints")]
    pub stop_after: Option<u64>,

    /// Write a self-contained HTML page with an SVG timeline of device memory by class per
    /// step (needs a device arena: --device cuda or sim).
    #[arg(long, value_name = "FILE.html", help_heading = "Output")]
    pub memory_report: Option<PathBuf>,

    /// Write where each step's time goes as CSV here (host time by phase: filling the pinned
    /// batch, index upload, staging on the copy stream, queueing the step, read-back waits,
    /// progress; and the step's GPU span from events on the engine stream), and print the
    /// means at the end.
    #[arg(long, value_name = "FILE.csv", help_heading = "Output")]
    pub timeline: Option<PathBuf>,

    /// Write every reported metric here, one row per epoch (train loss, validation loss and
    /// the task's metrics: accuracy, or a regression's MSE, MAE and Pearson r; rate, time):
    /// CSV, or JSON lines when the name ends in .jsonl; pandas reads either. A resumed run
    /// appends.
    #[arg(long, value_name = "FILE.csv", help_heading = "Output")]
    pub metrics: Option<PathBuf>,

    /// Also write a row every this many optimiser steps (the step's loss, gradient norm and
    /// learning rate; steps are read back every --readback-every, so the rows come then).
    #[arg(
        long,
        value_name = "STEPS",
        requires = "metrics",
        help_heading = "Output"
    )]
    pub metrics_every: Option<u64>,

    /// Soak test: sample memory (arena in use and high-water, device memory in use, host
    /// resident memory) every --soak-every steps and write them, with each one's slope per
    /// 1,000 steps after the warm-up (the first tenth of the steps), as JSON here.
    #[arg(long, value_name = "FILE.json", help_heading = "Output")]
    pub soak_report: Option<PathBuf>,

    /// Steps between two soak samples.
    #[arg(
        long,
        value_name = "STEPS",
        default_value_t = 100,
        requires = "soak_report",
        help_heading = "Output"
    )]
    pub soak_every: u64,

    /// Print the memory plan of this run and exit without training: peak device memory by
    /// class (persistent, saved, scratch, graph) for both schedules, the arena size that holds
    /// one step without overflow, and whether the GPU has it. Runs on an accounting-only
    /// simulated device, so it needs no GPU and takes seconds at any model size.
    #[arg(long, help_heading = "Output")]
    pub plan: bool,

    /// With --plan: print the plan as one JSON object.
    #[arg(long, requires = "plan", help_heading = "Output")]
    pub json: bool,

    /// Log level of the libraries' tracing output on stderr.
    #[arg(long, default_value = "warn", value_parser = ["error", "warn", "info", "debug", "trace"], help_heading = "Output")]
    pub log: String,
}

pub(crate) fn parse_size(text: &str) -> std::result::Result<u64, String> {
    zcompute::units::parse_bytes(text)
}

impl Options {
    /// The simulated device --device sim opens: --sim-memory, --sim-op-time.
    #[must_use]
    pub fn sim_config(&self) -> zcompute::SimConfig {
        zcompute::SimConfig {
            op_time: std::time::Duration::try_from_secs_f64(self.sim_op_time)
                .unwrap_or(zcompute::SimConfig::default().op_time),
            ..zcompute::SimConfig::with_capacity(self.sim_memory)
        }
    }

    /// SGD's settings with `--optimizer sgd` (`None`: AdamW); `--momentum` or `--nesterov`
    /// without it, a momentum that is not a finite value >= 0, or Nesterov without momentum
    /// are refused.
    fn sgd(&self) -> Result<Option<zgrad::SgdHyper>> {
        let bad = |m: String| Err(TrainError::Options(m));
        if self.optimizer != "sgd" {
            if self.momentum != 0.0 || self.nesterov {
                return bad("--momentum and --nesterov need --optimizer sgd".into());
            }
            return Ok(None);
        }
        if !(self.momentum.is_finite() && self.momentum >= 0.0) {
            return bad(format!("--momentum {} must be >= 0", self.momentum));
        }
        if self.nesterov && self.momentum == 0.0 {
            return bad("--nesterov needs a --momentum above 0".into());
        }
        Ok(Some(zgrad::SgdHyper {
            momentum: self.momentum,
            nesterov: self.nesterov,
            weight_decay: self.weight_decay,
            ..zgrad::SgdHyper::default()
        }))
    }

    /// The checked run configuration.
    pub fn config(&self) -> Result<RunConfig> {
        let bad = |m: String| Err(TrainError::Options(m));
        let model = XAssetConfig {
            // A window of S bars is a sample of S scales.
            scales: self.window.unwrap_or(self.scales),
            features: self.features,
            width: self.width,
            heads: self.heads,
            ff: self.ff,
            layers: self.layers,
        };
        check_model(&model)?;
        if self.batch == 0 {
            return bad("--batch must be at least 1".into());
        }
        if self.epochs == 0 {
            return bad("--epochs must be at least 1".into());
        }
        if !(0.0..1.0).contains(&self.validate_fraction) {
            return bad(format!(
                "--validate-fraction {} must be in [0, 1)",
                self.validate_fraction
            ));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("--lr {} must be a positive number", self.lr));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(format!("--weight-decay {} must be >= 0", self.weight_decay));
        }
        let sgd = self.sgd()?;
        if let Some(c) = self.clip_grad
            && !(c.is_finite() && c > 0.0)
        {
            return bad(format!("--clip-grad {c} must be a positive number"));
        }
        if self.sim_memory < 1 << 20 {
            return bad(format!(
                "--sim-memory {} must be at least 1M",
                zcompute::units::Bytes(self.sim_memory)
            ));
        }
        if !(self.sim_op_time.is_finite() && self.sim_op_time > 0.0 && self.sim_op_time <= 60.0) {
            return bad(format!(
                "--sim-op-time {}: expected a positive number of seconds, at most 60",
                self.sim_op_time
            ));
        }
        if self.soak_every == 0 {
            return bad("--soak-every must be at least 1".into());
        }
        if self.readback_every == 0 {
            return bad("--readback-every must be at least 1".into());
        }
        if self.metrics_every == Some(0) {
            return bad("--metrics-every must be at least 1".into());
        }
        if self.checkpoint_every == Some(0) {
            return bad("--checkpoint-every must be at least 1".into());
        }
        if self.stop_after.is_some() && self.checkpoint.is_none() {
            return bad("--stop-after needs --checkpoint (else the work is lost)".into());
        }
        if self.window == Some(0) {
            return bad("--window must be at least 1".into());
        }
        let data = match &self.data {
            Some(path) => DataSource::File {
                path: path.clone(),
                format: crate::data::formats::Format::of(path)?,
                labels: self.labels.clone(),
                window: self.window,
                gap: self.gap,
            },
            None if self.samples < 2 => {
                return bad("--samples must be at least 2".into());
            }
            None => DataSource::Synthetic {
                samples: self.samples,
                seed: self.data_seed,
            },
        };
        Ok(RunConfig {
            model,
            data,
            validate_fraction: self.validate_fraction,
            epochs: self.epochs,
            batch: self.batch,
            lr: self.lr,
            lr_schedule: self.lr_schedule,
            warmup_steps: self.warmup_steps,
            weight_decay: self.weight_decay,
            sgd,
            clip_grad: self.clip_grad,
            schedule: self.schedule,
            capture: self.capture,
            precision: self.precision,
            seed: self.seed,
            normalize: self.normalize,
        })
    }
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
