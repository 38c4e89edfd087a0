//! `einsum` for one and two operands, composed of views, sums and one
//! (batched) matrix product, so that it runs on the GEMM and its gradient is
//! the composition's.

use fucina_exec::ExecContext;

use crate::error::{AutogradError, Result};
use crate::tensor::Tensor;

/// The Einstein summation `spec` over one or two `operands`, as numpy's and
/// PyTorch's `einsum` for these cases: each operand's axes are named by one
/// ASCII letter of its term (`"bij,bjk->bik"`); a letter shared by both
/// operands and kept in the output is a batch axis, one shared and left out
/// is contracted (multiplied and summed), one of a single operand left out is
/// summed, and the output's axes come in the order of the letters after
/// `->`. Without `->` the output is every letter that appears once,
/// in alphabetical order (`"ij,jk"` is `"ij,jk->ik"`, `"ij"` is `"ij->ij"`,
/// `"ji"` is `"ji->ij"`, a transpose). Spaces are ignored.
///
/// Two operands run as one product on the GEMM: each operand's letters are
/// arranged (a view where its axes already come in a usable order, else a
/// contiguous copy) as `[batch, rows, contracted]` and `[batch, contracted,
/// columns]`, [`matmul`](Tensor::matmul) multiplies them, and the result is
/// reshaped and permuted to the output; letters of one operand left out of
/// the output are summed first with [`sum`](Tensor::sum). So
/// `"ij,jk->ik"`, `"bij,bjk->bik"`, `"bhqd,bhkd->bhqk"` (attention scores),
/// `"ij,j->i"` (a matrix-vector product), `"i,i->"` (a dot product) and
/// `"bi,bj->bij"` (a batched outer product, depth 1) are each one GEMM call,
/// with the GEMM's determinism (the same bits at every thread count and
/// vector level) and, inside an [`autocast_bf16`](crate::autocast_bf16)
/// scope, its bf16-rounded operands. Gradients are recorded by the ops it is
/// made of.
///
/// ```
/// use fucina_autograd::{Tensor, einsum};
/// use fucina_autograd::exec::ExecContext;
///
/// let ctx = ExecContext::new();
/// let a = Tensor::variable_from_slice(&ctx, &[2, 2], &[1., 2., 3., 4.])?;
/// let b = Tensor::variable_from_slice(&ctx, &[2, 2], &[5., 6., 7., 8.])?;
/// assert_eq!(einsum(&ctx, "ij,jk->ik", &[&a, &b])?.to_vec(), a.matmul(&ctx, &b)?.to_vec());
/// assert_eq!(einsum(&ctx, "ij->ji", &[&a])?.to_vec(), [1., 3., 2., 4.]);
/// assert_eq!(einsum(&ctx, "ij,ij->", &[&a, &b])?.to_vec(), [70.]);
/// einsum(&ctx, "ij,jk", &[&a, &b])?.sum_all(&ctx)?.backward(&ctx)?;
/// assert_eq!(a.grad(&ctx)?.expect("a variable").to_vec(), [11., 15., 11., 15.]);
/// assert!(einsum(&ctx, "ij,jk->ii", &[&a, &b]).is_err());
/// # Ok::<(), fucina_autograd::AutogradError>(())
/// ```
///
/// # Errors
/// [`AutogradError::Einsum`] naming what is wrong: a character that is not
/// an ASCII letter (an ellipsis `...` included: not supported), more than one
/// `->`, a number of terms other than one or two or other than the number of
/// operands, a term whose letter count is not its operand's rank, a letter
/// repeated within one term (diagonals are not supported) or in the output,
/// an output letter that no input has, a letter whose sizes differ between
/// the operands (naming the letter and both sizes). Out of memory.
pub fn einsum(ctx: &ExecContext, spec: &str, operands: &[&Tensor]) -> Result<Tensor> {
    let shapes: Vec<&[usize]> = operands.iter().map(|t| t.shape()).collect();
    let parsed = Parsed::new(spec, &shapes).map_err(|reason| AutogradError::Einsum {
        spec: spec.into(),
        reason: reason.into(),
    })?;
    match operands {
        [a] => parsed.one(ctx, a),
        [a, b] => parsed.two(ctx, a, b),
        _ => unreachable!("Parsed::new checks the operand count"),
    }
}

/// A checked spec: the letters of each input term and of the output, and the
/// size of each letter.
struct Parsed {
    inputs: Vec<Vec<u8>>,
    output: Vec<u8>,
    sizes: [usize; 128],
}

fn letters(term: &str, what: &str) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(term.len());
    for c in term.chars().filter(|c| !c.is_whitespace()) {
        if c == '.' {
            return Err("an ellipsis (...) is not supported".into());
        }
        if !c.is_ascii_alphabetic() {
            return Err(format!("'{c}' in {what} is not an ASCII letter"));
        }
        let c = c as u8;
        if out.contains(&c) {
            return Err(match what {
                "the output" => format!("letter '{}' appears twice in the output", c as char),
                _ => format!(
                    "letter '{}' appears twice in {what} (diagonals are not supported)",
                    c as char
                ),
            });
        }
        out.push(c);
    }
    Ok(out)
}

impl Parsed {
    fn new(spec: &str, shapes: &[&[usize]]) -> std::result::Result<Parsed, String> {
        let (lhs, rhs) = match spec.split_once("->") {
            Some((_, r)) if r.contains("->") => return Err("more than one \"->\"".into()),
            Some((l, r)) => (l, Some(r)),
            None => (spec, None),
        };
        let terms: Vec<&str> = lhs.split(',').collect();
        if terms.len() > 2 {
            return Err(format!("{} operands: einsum takes one or two", terms.len()));
        }
        if terms.len() != shapes.len() {
            return Err(format!(
                "the spec names {} operand(s), {} given",
                terms.len(),
                shapes.len()
            ));
        }
        let mut sizes = [usize::MAX; 128];
        let mut inputs = Vec::with_capacity(2);
        for (i, (term, shape)) in terms.iter().zip(shapes).enumerate() {
            let ls = letters(term, &format!("operand {i}"))?;
            if ls.len() != shape.len() {
                return Err(format!(
                    "operand {i} has {} axes, its term \"{}\" names {}",
                    shape.len(),
                    term.trim(),
                    ls.len()
                ));
            }
            for (&c, &n) in ls.iter().zip(shape.iter()) {
                let s = &mut sizes[usize::from(c)];
                if *s != usize::MAX && *s != n {
                    return Err(format!(
                        "letter '{}' has size {} in operand 0 and {n} in operand {i}",
                        c as char, *s
                    ));
                }
                *s = n;
            }
            inputs.push(ls);
        }
        let output = match rhs {
            Some(r) => {
                let out = letters(r, "the output")?;
                if let Some(&c) = out.iter().find(|c| !inputs.iter().any(|t| t.contains(c))) {
                    return Err(format!("output letter '{}' is not in any input", c as char));
                }
                out
            }
            None => {
                let mut out: Vec<u8> = inputs
                    .iter()
                    .flatten()
                    .copied()
                    .filter(|c| inputs.iter().flatten().filter(|d| *d == c).count() == 1)
                    .collect();
                out.sort_unstable();
                out
            }
        };
        Ok(Parsed {
            inputs,
            output,
            sizes,
        })
    }

    fn size(&self, c: u8) -> usize {
        self.sizes[usize::from(c)]
    }

    /// `t` (named by `names`) with the axes whose letters are not in `keep`
    /// summed out, and the letters left.
    fn sum_out(
        ctx: &ExecContext,
        t: &Tensor,
        names: &[u8],
        keep: impl Fn(u8) -> bool,
    ) -> Result<(Tensor, Vec<u8>)> {
        let mut t = t.clone();
        let mut left = names.to_vec();
        for axis in (0..names.len()).rev() {
            if !keep(names[axis]) {
                t = t.sum(ctx, axis, false)?;
                left.remove(axis);
            }
        }
        Ok((t, left))
    }

    /// `t` (named by `names`) with its axes in the order of `order` (a view).
    fn arrange(ctx: &ExecContext, t: &Tensor, names: &[u8], order: &[u8]) -> Result<Tensor> {
        let perm: Vec<usize> = order
            .iter()
            .map(|c| names.iter().position(|d| d == c).expect("a letter of t"))
            .collect();
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(t.clone());
        }
        t.permute(ctx, &perm)
    }

    fn one(&self, ctx: &ExecContext, a: &Tensor) -> Result<Tensor> {
        if self.output.is_empty() && !self.inputs[0].is_empty() {
            return a.sum_all(ctx);
        }
        let (t, names) = Self::sum_out(ctx, a, &self.inputs[0], |c| self.output.contains(&c))?;
        Self::arrange(ctx, &t, &names, &self.output)
    }

    fn two(&self, ctx: &ExecContext, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let (ta, tb) = (&self.inputs[0], &self.inputs[1]);
        let out = &self.output;
        // Letters of one operand only that the output drops are summed first.
        let (a, na) = Self::sum_out(ctx, a, ta, |c| out.contains(&c) || tb.contains(&c))?;
        let (b, nb) = Self::sum_out(ctx, b, tb, |c| out.contains(&c) || ta.contains(&c))?;
        let pick = |f: &dyn Fn(u8) -> bool, from: &[u8]| -> Vec<u8> {
            from.iter().copied().filter(|&c| f(c)).collect()
        };
        let batch = pick(&|c| na.contains(&c) && nb.contains(&c), out);
        let rows = pick(&|c| na.contains(&c) && !nb.contains(&c), out);
        let cols = pick(&|c| nb.contains(&c) && !na.contains(&c), out);
        let depth = pick(&|c| nb.contains(&c) && !out.contains(&c), &na);
        let prod = |ls: &[u8]| ls.iter().map(|&c| self.size(c)).product::<usize>();
        let (nbatch, m, k, n) = (prod(&batch), prod(&rows), prod(&depth), prod(&cols));
        let lead: Vec<usize> = if batch.is_empty() {
            vec![]
        } else {
            vec![nbatch]
        };
        let a = self.operand(ctx, &a, &na, &batch, [&rows, &depth], &lead, [m, k])?;
        let b = self.operand(ctx, &b, &nb, &batch, [&depth, &cols], &lead, [k, n])?;
        let c = a.matmul(ctx, &b)?;
        let names: Vec<u8> = [&batch[..], &rows, &cols].concat();
        let mut shape: Vec<usize> = names.iter().map(|&c| self.size(c)).collect();
        if shape.is_empty() {
            // A full contraction: one element, shape [1] (tensors have rank >= 1).
            shape.push(1);
        }
        let c = if c.shape() == shape.as_slice() {
            c
        } else {
            c.reshape(ctx, &shape)?
        };
        Self::arrange(ctx, &c, &names, out)
    }

    /// One operand of the product as `lead ++ [p, q]`, its letters `batch ++
    /// pq[0] ++ pq[1]`: arranged in that order, or as `batch ++ pq[1] ++
    /// pq[0]` transposed when that order is the one it already has (no copy).
    #[allow(clippy::too_many_arguments)]
    fn operand(
        &self,
        ctx: &ExecContext,
        t: &Tensor,
        names: &[u8],
        batch: &[u8],
        pq: [&[u8]; 2],
        lead: &[usize],
        [p, q]: [usize; 2],
    ) -> Result<Tensor> {
        let swapped: Vec<u8> = [batch, pq[1], pq[0]].concat();
        let r = lead.len();
        if swapped.as_slice() == names && pq[0] != pq[1] {
            let shape: Vec<usize> = lead.iter().copied().chain([q, p]).collect();
            return t.reshape(ctx, &shape)?.transpose(ctx, r, r + 1);
        }
        let order: Vec<u8> = [batch, pq[0], pq[1]].concat();
        let t = Self::arrange(ctx, t, names, &order)?;
        let shape: Vec<usize> = lead.iter().copied().chain([p, q]).collect();
        if t.shape() == shape.as_slice() {
            return Ok(t);
        }
        t.reshape(ctx, &shape)
    }
}
