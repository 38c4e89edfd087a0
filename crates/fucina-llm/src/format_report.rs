//! What each tensor of a loaded model is stored as, and why: the rule
//! [`WeightStore::convert`](crate::WeightStore::convert) follows to pick a
//! matrix's format ([`conversion_target`]), and the per-tensor summary a store
//! and a model expose ([`FormatReport`], from
//! [`WeightStore::format_report`](crate::WeightStore::format_report) and
//! [`Model::formats`](crate::Model::formats)).
//!
//! A GGUF file read as it is reports its own mix of types (every tensor
//! [`FormatChoice::File`]); a model converted at load (`--dtype q4_k`) reports
//! which matrices took the asked format, which the output projection's, and
//! which fell back because their rows are not whole blocks.
//!
//! ```
//! use fucina_llm::format_report::{FormatChoice, conversion_target};
//! use fucina_llm::fucina::exec::{QuantFormat, TensorFormat};
//!
//! // SmolLM2-135M's q projection (576 columns) asked as Q4_K: 576 is not a
//! // multiple of 256, so it falls back to Q5_0, as llama.cpp's does.
//! let (format, why) = conversion_target(TensorFormat::Q4_K, 576, false);
//! assert_eq!(format, TensorFormat::Q5_0);
//! assert_eq!(why, FormatChoice::Fallback { wanted: QuantFormat::Q4_K });
//! // Its down projection (1536 columns, six super-blocks) stays Q4_K.
//! assert_eq!(conversion_target(TensorFormat::Q4_K, 1536, false).0, TensorFormat::Q4_K);
//! ```

use std::collections::HashMap;
use std::fmt::{self, Write as _};

use fucina::exec::{QuantFormat, Storage, TensorFormat};

use crate::weights::k_fallback;

/// Why a tensor has its format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FormatChoice {
    /// The file's own format: no conversion was asked, or the tensor is not a
    /// matrix (a norm, a bias), which conversion keeps as it is.
    File,
    /// The asked format.
    Asked,
    /// The output projection's format, with more bits than the asked one (Q6_K
    /// for the super-block formats, Q8_0 for the formats of blocks of 32).
    Output,
    /// The fallback of `wanted` (the asked format, or the output projection's
    /// Q6_K): the matrix's column count is not a multiple of `wanted`'s
    /// super-block of 256, so it takes [`k_fallback`]`(wanted)`, a format of
    /// blocks of 32.
    Fallback {
        /// The format the matrix would have had.
        wanted: QuantFormat,
    },
}

/// The format [`WeightStore::convert`](crate::WeightStore::convert) gives a
/// matrix of `cols` columns (its input features, the dimension the blocks run
/// along) when `dtype` is asked, and why. `output`: whether the matrix is the
/// output projection (`lm_head.weight`, or the embedding table when the
/// embeddings are tied).
///
/// The rule, llama.cpp's `llama-quantize`'s:
///
/// 1. the output projection keeps more bits for every block format but Q8_0 and Q6_K:
///    Q6_K for the other super-block formats (Q2_K, Q3_K, Q4_K, Q5_K, IQ4_XS),
///    Q8_0 for the formats of blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) —
///    [`FormatChoice::Output`]; every other matrix takes `dtype`
///    ([`FormatChoice::Asked`]);
/// 2. a super-block format needs whole super-blocks of 256 along the columns:
///    when `cols` is not a multiple of 256 the matrix takes [`k_fallback`] of
///    the format of step 1 ([`FormatChoice::Fallback`]): Q4_K → Q5_0, Q5_K →
///    Q5_1, Q6_K → Q8_0, and Q2_K, Q3_K and IQ4_XS → IQ4_NL.
///
/// A float `dtype` (f32, f16, bf16) applies to every matrix as it is. The
/// result may still not fit (a column count that is not a multiple of 32):
/// `convert` refuses such a matrix, naming it.
pub fn conversion_target(
    dtype: TensorFormat,
    cols: usize,
    output: bool,
) -> (TensorFormat, FormatChoice) {
    let Storage::Quant(asked) = dtype.storage() else {
        return (dtype, FormatChoice::Asked);
    };
    let (q, choice) = match asked {
        QuantFormat::Q8_0 | QuantFormat::Q6_K => (asked, FormatChoice::Asked),
        _ if output && asked.block_elements() == 32 => (QuantFormat::Q8_0, FormatChoice::Output),
        _ if output => (QuantFormat::Q6_K, FormatChoice::Output),
        _ => (asked, FormatChoice::Asked),
    };
    if cols.is_multiple_of(q.block_elements()) {
        (q.into(), choice)
    } else {
        (k_fallback(q).into(), FormatChoice::Fallback { wanted: q })
    }
}

/// One tensor of a [`FormatReport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorFormatEntry {
    /// The tensor's name (Hugging Face's, also for a GGUF file).
    pub name: String,
    /// Its shape, outermost first.
    pub shape: Vec<usize>,
    /// What it is stored as.
    pub format: TensorFormat,
    /// Why.
    pub choice: FormatChoice,
}

/// What every tensor of a store is stored as, sorted by name:
/// [`WeightStore::format_report`](crate::WeightStore::format_report) and
/// [`Model::formats`](crate::Model::formats).
///
/// `Display` writes the compact summary ([`summary`](FormatReport::summary)),
/// [`listing`](FormatReport::listing) one line per tensor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FormatReport {
    entries: Vec<TensorFormatEntry>,
}

impl FormatReport {
    /// A report of `entries` (sorted here by name).
    pub fn new(mut entries: Vec<TensorFormatEntry>) -> FormatReport {
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        FormatReport { entries }
    }

    /// Every tensor, sorted by name.
    pub fn entries(&self) -> &[TensorFormatEntry] {
        &self.entries
    }

    /// The tensor `name`'s entry.
    pub fn get(&self, name: &str) -> Option<&TensorFormatEntry> {
        self.entries
            .binary_search_by(|e| e.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.entries[i])
    }

    /// How many tensors each format holds, in the order of
    /// [`FORMATS`](fucina::exec::FORMATS), formats holding none left out.
    pub fn counts(&self) -> Vec<(TensorFormat, usize)> {
        TensorFormat::ALL
            .iter()
            .map(|&f| (f, self.entries.iter().filter(|e| e.format == f).count()))
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// The tensors that fell back ([`FormatChoice::Fallback`]).
    pub fn fallbacks(&self) -> impl Iterator<Item = &TensorFormatEntry> {
        self.entries
            .iter()
            .filter(|e| matches!(e.choice, FormatChoice::Fallback { .. }))
    }

    /// The compact summary: the count per format, then the fallbacks grouped by
    /// name with the layer (and expert) index written `*` (one line per group:
    /// the name, how many tensors, the columns, the wanted and the taken
    /// format). For example, a two-layer model of hidden size 256 and MLP
    /// width 320 converted to Q4_K:
    ///
    /// ```text
    /// formats: 5 f32, 2 q5_0, 13 q4_k, 1 q6_k (2 fell back)
    ///   model.layers.*.mlp.down_proj.weight ×2: 320 columns, q4_k → q5_0
    /// ```
    pub fn summary(&self) -> String {
        let counts: Vec<String> = self
            .counts()
            .iter()
            .map(|(f, n)| format!("{n} {f}"))
            .collect();
        let mut s = format!("formats: {}", counts.join(", "));
        let n_fallbacks = self.fallbacks().count();
        if n_fallbacks == 0 {
            return s;
        }
        let _ = write!(s, " ({n_fallbacks} fell back)");
        // Grouped by (name pattern, columns, wanted, taken), first seen first.
        let mut groups: HashMap<(String, usize, QuantFormat, TensorFormat), usize> = HashMap::new();
        let mut order = Vec::new();
        for e in self.fallbacks() {
            let FormatChoice::Fallback { wanted } = e.choice else {
                continue;
            };
            let cols = e.shape.last().copied().unwrap_or(0);
            let key = (layer_pattern(&e.name), cols, wanted, e.format);
            let n = groups.entry(key.clone()).or_insert(0);
            if *n == 0 {
                order.push(key);
            }
            *n += 1;
        }
        for key in order {
            let (name, cols, wanted, taken) = &key;
            let n = groups[&key];
            let _ = write!(
                s,
                "\n  {name}{}: {cols} columns, {} → {taken}",
                if n > 1 {
                    format!(" ×{n}")
                } else {
                    String::new()
                },
                TensorFormat::from(*wanted),
            );
        }
        s
    }

    /// One line per tensor: its name, shape, format and why (`file`, `asked`,
    /// `output`, `fallback of q4_k`).
    pub fn listing(&self) -> String {
        let mut s = String::new();
        for e in &self.entries {
            let why = match e.choice {
                FormatChoice::File => "file".to_string(),
                FormatChoice::Asked => "asked".to_string(),
                FormatChoice::Output => "output projection".to_string(),
                FormatChoice::Fallback { wanted } => {
                    format!("fallback of {}", TensorFormat::from(wanted))
                }
            };
            let _ = writeln!(s, "{} {:?} {} ({why})", e.name, e.shape, e.format);
        }
        s
    }
}

impl fmt::Display for FormatReport {
    /// The compact [`summary`](FormatReport::summary).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
}

/// `name` with every numeric part (a layer's, an expert's index) written `*`
/// (`model.layers.3.mlp.experts.5.up_proj.weight` →
/// `model.layers.*.mlp.experts.*.up_proj.weight`); other names as they are.
fn layer_pattern(name: &str) -> String {
    name.split('.')
        .map(
            |p| match !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                true => "*",
                false => p,
            },
        )
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_indices_become_stars() {
        assert_eq!(
            layer_pattern("model.layers.12.mlp.up_proj.weight"),
            "model.layers.*.mlp.up_proj.weight"
        );
        assert_eq!(
            layer_pattern("model.layers.0.mlp.experts.17.down_proj.weight"),
            "model.layers.*.mlp.experts.*.down_proj.weight"
        );
        assert_eq!(layer_pattern("lm_head.weight"), "lm_head.weight");
        assert_eq!(layer_pattern("layers.x1.y"), "layers.x1.y");
    }
}
