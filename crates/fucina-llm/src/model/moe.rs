//! A mixture-of-experts MLP (Qwen3-MoE's sparse block): a router picks the
//! `top_k` experts of each token by softmax probability, each expert is a
//! SwiGLU MLP of its own, and a token's output is the probability-weighted
//! sum of its experts' outputs.
//!
//! The tokens of a call routed to an expert go through its three products
//! together (one product per expert, over those rows only: an expert no
//! token chose is never read). Every product's row is fixed by its input row
//! alone, and a token sums its experts' outputs in increasing expert index
//! (as transformers' `index_add_` does), so a token's output does not depend
//! on which other tokens share its experts: batches, threads and vector
//! levels give the same bits.

use fucina::ExecContext;
use fucina::exec::{GroupedProduct, GroupedScratch};

use super::kernels;
use crate::arch::ExpertNames;
use crate::error::LlmError;
use crate::weights::Weight;

/// One expert's SwiGLU MLP.
pub(super) struct Expert {
    pub(super) gate: Weight,
    pub(super) up: Weight,
    pub(super) down: Weight,
}

/// The sparse MLP of one layer.
pub(super) struct Moe {
    /// `[experts, hidden]`.
    pub(super) router: Weight,
    pub(super) experts: Vec<Expert>,
    pub(super) top_k: usize,
    /// The chosen probabilities are divided by their sum.
    pub(super) norm_topk_prob: bool,
    /// The experts' MLP width.
    pub(super) inter: usize,
    /// The tensors' names.
    pub(super) names: ExpertNames,
}

/// The MoE activations of one call, reused across calls.
#[derive(Default)]
pub(super) struct MoeScratch {
    /// `[rows, experts]` router logits, then probabilities.
    probs: Vec<f32>,
    /// `[rows, top_k]` chosen experts and their weights, in increasing
    /// expert index.
    chosen: Vec<(usize, f32)>,
    /// The rows routed to each chosen expert and their weights, expert after
    /// expert in increasing index.
    members: Vec<(usize, f32)>,
    /// `(expert, start, count)`: each chosen expert's run of `members`.
    groups: Vec<(usize, usize, usize)>,
    /// `[members, hidden]` their inputs, then the experts' outputs.
    input: Vec<f32>,
    output: Vec<f32>,
    /// `[members, inter]`.
    gate: Vec<f32>,
    up: Vec<f32>,
    /// The grouped calls' work lists.
    grouped: GroupedScratch,
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

impl Moe {
    /// Weight bytes one token reads: the router and `top_k` experts.
    pub(super) fn bytes_per_token(&self) -> usize {
        let expert = self.experts.first().map_or(0, |e| {
            e.gate.bytes().len() + e.up.bytes().len() + e.down.bytes().len()
        });
        self.router.bytes().len() + self.top_k * expert
    }

    /// Every matrix with its Hugging Face name (without the layer prefix).
    pub(super) fn named_mut(&mut self) -> Vec<(String, &mut Weight)> {
        let n = self.names;
        let mut all = vec![(n.router.to_string(), &mut self.router)];
        for (i, e) in self.experts.iter_mut().enumerate() {
            all.push((format!("{}.{i}.{}", n.experts, n.gate), &mut e.gate));
            all.push((format!("{}.{i}.{}", n.experts, n.up), &mut e.up));
            all.push((format!("{}.{i}.{}", n.experts, n.down), &mut e.down));
        }
        all
    }

    /// `out` (`[rows, hidden]`) = the MLP of the rows `xn`.
    pub(super) fn forward(
        &self,
        ctx: &ExecContext,
        xn: &[f32],
        rows: usize,
        out: &mut [f32],
        s: &mut MoeScratch,
    ) -> Result<(), LlmError> {
        let (n_exp, k, inter) = (self.experts.len(), self.top_k, self.inter);
        let hid = xn.len() / rows;
        grow(&mut s.probs, rows * n_exp);
        let probs = &mut s.probs[..rows * n_exp];
        self.router.matmul(ctx, xn, rows, probs)?;
        s.chosen.clear();
        for p in probs.chunks_exact_mut(n_exp) {
            softmax(p);
            let start = s.chosen.len();
            // The k largest, ties to the lower index.
            for _ in 0..k {
                let best = (0..n_exp)
                    .filter(|e| !s.chosen[start..].iter().any(|(c, _)| c == e))
                    .fold(None, |b: Option<usize>, e| match b {
                        Some(b) if p[b] >= p[e] => Some(b),
                        _ => Some(e),
                    })
                    .unwrap_or(0);
                s.chosen.push((best, p[best]));
            }
            let chosen = &mut s.chosen[start..];
            if self.norm_topk_prob {
                // The sum in the order torch.topk returns them (largest first).
                let sum = chosen.iter().fold(0.0f32, |a, &(_, w)| a + w);
                chosen.iter_mut().for_each(|(_, w)| *w /= sum);
            }
            chosen.sort_by_key(|&(e, _)| e);
        }
        self.route_members(rows, s);
        let total = s.members.len();
        grow(&mut s.input, total * hid);
        grow(&mut s.output, total * hid);
        grow(&mut s.gate, total * inter);
        grow(&mut s.up, total * inter);
        for (i, &(r, _)) in s.members.iter().enumerate() {
            s.input[i * hid..(i + 1) * hid].copy_from_slice(&xn[r * hid..(r + 1) * hid]);
        }
        let (gate, up) = (&mut s.gate[..total * inter], &mut s.up[..total * inter]);
        let groups = &s.groups;
        let grouped = &mut s.grouped;
        let input = &s.input[..total * hid];
        self.expert_products(ctx, grouped, groups, input, hid, gate, up, |e| {
            (&e.gate, &e.up)
        })?;
        kernels::swiglu(gate, up);
        let y = &mut s.output[..total * hid];
        self.expert_products(ctx, grouped, groups, gate, inter, y, &mut [], |e| {
            (&e.down, &e.down)
        })?;
        // Experts in increasing index: each row's sum in that order.
        out[..rows * hid].fill(0.0);
        for &(_, start, m) in &s.groups {
            for (i, &(r, w)) in s.members[start..start + m].iter().enumerate() {
                let yi = &y[(start + i) * hid..(start + i + 1) * hid];
                for (o, &v) in out[r * hid..(r + 1) * hid].iter_mut().zip(yi) {
                    *o += v * w;
                }
            }
        }
        Ok(())
    }
}

impl Moe {
    /// Fills `s.members` with the rows routed to each chosen expert (expert
    /// after expert, in increasing index; each expert's rows in increasing
    /// order, with their weights) and `s.groups` with `(expert, start, count)`
    /// of each expert some row chose.
    fn route_members(&self, rows: usize, s: &mut MoeScratch) {
        let k = self.top_k;
        s.members.clear();
        s.groups.clear();
        for e in 0..self.experts.len() {
            let start = s.members.len();
            for (r, ch) in s.chosen.chunks_exact(k).enumerate().take(rows) {
                if let Some(&(_, w)) = ch.iter().find(|(c, _)| *c == e) {
                    s.members.push((r, w));
                }
            }
            if s.members.len() > start {
                s.groups.push((e, start, s.members.len() - start));
            }
        }
    }

    /// The products of the chosen experts in one grouped call
    /// ([`ExecContext::grouped_matmul`]): for each group `(expert, start, m)`,
    /// its rows `start..start + m` of `x` (rows of `cols`) through the first
    /// weight `pick` gives into `a`, and, when `b` is not empty, through the
    /// second into `b` (rows of the weights' output features). The call's
    /// work lists come from `scratch` (no allocation at steady state).
    #[allow(clippy::too_many_arguments)] // two outputs and the weights' choice
    fn expert_products<'w>(
        &'w self,
        ctx: &ExecContext,
        scratch: &mut GroupedScratch,
        groups: &[(usize, usize, usize)],
        x: &[f32],
        cols: usize,
        a: &mut [f32],
        b: &mut [f32],
        pick: impl Fn(&'w Expert) -> (&'w Weight, &'w Weight),
    ) -> Result<(), LlmError> {
        let total: usize = groups.iter().map(|g| g.2).sum();
        let width = a.len() / total.max(1);
        let (mut ra, mut rb) = (a, b);
        let mut products = scratch.list();
        for &(e, start, m) in groups {
            let (wa, wb) = pick(&self.experts[e]);
            let xe = &x[start * cols..(start + m) * cols];
            let (oa, rest) = std::mem::take(&mut ra).split_at_mut(m * width);
            ra = rest;
            products.push(GroupedProduct {
                weight: wa.grouped()?,
                x: xe,
                m,
                out: oa,
            });
            if !rb.is_empty() {
                let (ob, rest) = std::mem::take(&mut rb).split_at_mut(m * width);
                rb = rest;
                products.push(GroupedProduct {
                    weight: wb.grouped()?,
                    x: xe,
                    m,
                    out: ob,
                });
            }
        }
        products.run(ctx)?;
        Ok(())
    }
}

/// Softmax in place, in f32 (the maximum subtracted, the sum in increasing
/// index).
fn softmax(p: &mut [f32]) {
    let max = p.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    for x in p.iter_mut() {
        *x = kernels::exp(*x - max);
    }
    let sum = p.iter().fold(0.0f32, |a, &x| a + x);
    p.iter_mut().for_each(|x| *x /= sum);
}
