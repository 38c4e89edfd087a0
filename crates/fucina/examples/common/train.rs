//! What the `train_digits` and `train_fashion` jobs share (each `job.rs`
//! includes this file with `#[path]`): the `--stop-after` and resume checks,
//! the checkpoint with its metadata checks, and the SVG pieces and loss chart
//! (fucina-llm's `finetune` example includes it too, for the chart).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use fucina::nn::Sequential;
use fucina::optim::AdamW;
use fucina::{Error, ExecContext, Result};

/// A configuration entry of a checkpoint's metadata: `(key, flag, value)`.
/// Values are written with `Display`, which round-trips `f32` exactly.
pub(crate) type ConfigEntry = (&'static str, &'static str, String);

/// One step's progress (after the step), for a progress bar.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Progress {
    pub(crate) step: usize,
    pub(crate) steps: usize,
    pub(crate) epoch: usize,
    pub(crate) loss: f32,
    pub(crate) examples: usize,
    pub(crate) elapsed: Duration,
}

/// Checks `--stop-after`: within `1..=epochs` when given.
pub(crate) fn check_stop_after(stop_after: Option<usize>, epochs: usize) -> Result<()> {
    if let Some(e) = stop_after
        && !(1..=epochs).contains(&e)
    {
        return Err(Error::InvalidArgument {
            what: "--stop-after",
            reason: format!("must be in 1..={epochs} (--epochs), got {e}"),
        });
    }
    Ok(())
}

/// Checks that a snapshot at `epoch` lies within a run of `epochs` epochs.
pub(crate) fn check_snapshot_epoch(epoch: usize, epochs: usize) -> Result<()> {
    if epoch > epochs {
        return Err(Error::InvalidArgument {
            what: "resume",
            reason: format!("the snapshot is at epoch {epoch}, past the run's {epochs} epochs"),
        });
    }
    Ok(())
}

/// Checks that `--stop-after` (if given) lies after the epoch `epoch` of the
/// checkpoint at `path`.
pub(crate) fn check_stop_after_resume(
    stop_after: Option<usize>,
    path: &Path,
    epoch: usize,
) -> Result<()> {
    if let Some(stop) = stop_after
        && stop <= epoch
    {
        return Err(Error::InvalidArgument {
            what: "--stop-after",
            reason: format!(
                "the checkpoint {} is at epoch {epoch}; --stop-after {stop} is not later",
                path.display()
            ),
        });
    }
    Ok(())
}

/// A job's checkpoint file: where it is, which job and format wrote it, and
/// the configuration it must hold.
pub(crate) struct Checkpoint<'a> {
    /// The file.
    path: &'a Path,
    /// The job's name, for messages (`"train_digits"`).
    job: &'static str,
    /// The `format` metadata entry (`"fucina.train_digits.v1"`).
    format: &'static str,
    /// The configuration entries of the run.
    entries: Vec<ConfigEntry>,
    /// The run's epochs (a checkpoint's epoch lies in `0..=epochs`).
    epochs: usize,
}

impl<'a> Checkpoint<'a> {
    /// The checkpoint at `path` of the job `job` (its `format` metadata
    /// `format`) for a run of `epochs` epochs with the configuration `entries`.
    pub(crate) fn new(
        path: &'a Path,
        job: &'static str,
        format: &'static str,
        entries: Vec<ConfigEntry>,
        epochs: usize,
    ) -> Checkpoint<'a> {
        Checkpoint {
            path,
            job,
            format,
            entries,
            epochs,
        }
    }

    /// Saves `net` and `opt` with [`fucina::checkpoint::save_module`]
    /// (safetensors, written atomically): the model's state under
    /// `model.<name>`, the optimizer state under `optim.<name>`, and `format`,
    /// `epoch` and the configuration entries as metadata.
    pub(crate) fn save(&self, net: &Sequential, opt: &AdamW, epoch: usize) -> Result<()> {
        let epoch = epoch.to_string();
        let mut meta = vec![("format", self.format), ("epoch", epoch.as_str())];
        meta.extend(self.entries.iter().map(|(k, _, v)| (*k, v.as_str())));
        fucina::checkpoint::save_module(self.path, net, Some(opt), &meta)
    }

    /// Reads the checkpoint and checks it completely before anything trains:
    /// its format, that it was written with the same configuration (an error
    /// names the flag and both values), its epoch, and that its tensors fit the
    /// model and optimizer that `build` makes (`model` names that model in the
    /// error) with `steps_per_epoch` steps per epoch. Returns the epoch and
    /// the loaded model and optimizer.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] if the file cannot be read or is not a valid
    /// safetensors file; [`Error::InvalidArgument`] (`--resume`, naming the
    /// file) for a checkpoint that does not belong to this run.
    pub(crate) fn load(
        &self,
        ctx: &ExecContext,
        steps_per_epoch: usize,
        model: &str,
        build: impl FnOnce() -> Result<(Sequential, AdamW)>,
    ) -> Result<(usize, Sequential, AdamW)> {
        let (path, format) = (self.path, self.format);
        let meta = fucina::checkpoint::read_metadata(path)?;
        let bad = |reason: String| Error::InvalidArgument {
            what: "--resume",
            reason: format!("{}: {reason}", path.display()),
        };
        if meta.get("format") != Some(format) {
            return Err(bad(format!(
                "not a {} checkpoint (its `format` metadata is {:?}, expected {format:?})",
                self.job,
                meta.get("format")
            )));
        }
        for (key, flag, want) in &self.entries {
            match meta.get(key) {
                Some(v) if v == want => {}
                Some(v) => {
                    return Err(bad(format!(
                        "the checkpoint was written with {flag} {v}, this run has {flag} {want} \
                         (resume with the checkpoint's configuration)"
                    )));
                }
                None => return Err(bad(format!("the checkpoint has no `{key}` metadata"))),
            }
        }
        let epoch = meta
            .get("epoch")
            .and_then(|e| e.parse::<usize>().ok())
            .filter(|&e| e <= self.epochs)
            .ok_or_else(|| {
                bad(format!(
                    "its `epoch` metadata {:?} is not an epoch in 0..={}",
                    meta.get("epoch"),
                    self.epochs
                ))
            })?;
        // Load into a model and optimizer of this configuration (all or
        // nothing): the same checks the resumed run makes, done before anything
        // trains.
        let (net, mut opt) = build()?;
        fucina::checkpoint::load_module(ctx, path, &net, Some(&mut opt)).map_err(|e| {
            bad(format!(
                "does not match {model} or its optimizer state: {e}"
            ))
        })?;
        let step = opt.step_count();
        let want = epoch * steps_per_epoch;
        if step != want as u64 {
            return Err(bad(format!(
                "its optimizer has taken {step} steps, but epoch {epoch} ends at step {want}"
            )));
        }
        Ok((epoch, net, opt))
    }
}

/// Opens a standalone SVG of `w` x `h` with a white background, `title` on
/// top, and the bottom and left axes `pad` from the edges.
pub(crate) fn svg_open(s: &mut String, w: f32, h: f32, pad: f32, title: &str) {
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">{title}</text>\n\
         <line x1=\"{pad}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{}\" stroke=\"black\"/>\n",
        w / 2.0,
        h - pad,
        w - pad,
        h - pad,
        h - pad
    );
}

/// The epoch labels under the x axis (at most about ten, from `first_epoch`)
/// and the axis title, for `steps` steps of `steps_per_epoch` each placed by
/// `px`.
pub(crate) fn svg_epoch_axis(
    s: &mut String,
    (w, h, pad): (f32, f32, f32),
    steps: usize,
    steps_per_epoch: usize,
    first_epoch: usize,
    px: impl Fn(usize) -> f32,
) {
    if let Some(epochs) = steps.checked_div(steps_per_epoch) {
        let every = epochs.div_ceil(10).max(1);
        for e in (0..=epochs).step_by(every) {
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                px(e * steps_per_epoch),
                h - pad + 16.0,
                first_epoch + e
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">epoch</text>",
            w / 2.0,
            h - 8.0
        );
    }
}

/// The points of the loss polyline: step `i` at `(px(i), py(loss))`.
pub(crate) fn svg_loss_points(
    s: &mut String,
    losses: &[f32],
    px: impl Fn(usize) -> f32,
    py: impl Fn(f32) -> f32,
) {
    for (i, &l) in losses.iter().enumerate() {
        let _ = write!(s, "{:.1},{:.1} ", px(i), py(l));
    }
}

/// A line chart of `losses` (one point per step, the y axis from 0 to the
/// largest loss) as a standalone SVG titled `title`, the epoch axis labelled
/// from `first_epoch` for epochs of `steps_per_epoch` steps (the
/// `train_digits` job's chart, and the `finetune` example's of fucina-llm).
#[allow(dead_code)] // train_fashion draws its own chart (two curves)
pub(crate) fn loss_svg(
    title: &str,
    losses: &[f32],
    steps_per_epoch: usize,
    first_epoch: usize,
) -> String {
    let (w, h, pad) = (720.0f32, 360.0f32, 48.0f32);
    let max = losses.iter().copied().fold(f32::MIN, f32::max).max(1e-6);
    let n = losses.len().max(2) as f32 - 1.0;
    let px = |i: usize| pad + (w - 2.0 * pad) * i as f32 / n;
    let py = |v: f32| h - pad - (h - 2.0 * pad) * (v / max).clamp(0.0, 1.0);
    let mut s = String::new();
    svg_open(&mut s, w, h, pad, title);
    for k in 0..=4 {
        let v = max * k as f32 / 4.0;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{v:.2}</text>",
            pad - 4.0,
            py(v) + 4.0
        );
    }
    svg_epoch_axis(
        &mut s,
        (w, h, pad),
        losses.len(),
        steps_per_epoch,
        first_epoch,
        px,
    );
    s.push_str("<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.2\" points=\"");
    svg_loss_points(&mut s, losses, px, py);
    s.push_str("\"/>\n</svg>\n");
    s
}

/// Writes `contents` to `path`, creating the directory if needed.
pub(crate) fn write_file(path: &Path, contents: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, contents)?;
    Ok(())
}
