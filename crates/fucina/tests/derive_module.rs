//! `#[derive(Module)]`: stable dotted names for nested fields, `Vec`s,
//! `Option`s and `Box`es, `train` passed on, and a `save_module` /
//! `load_module` round trip of a derived model.

use fucina::checkpoint;
use fucina::nn::{Dropout, Linear, Module, Parameter, Sequential};
use fucina::optim::AdamW;
use fucina::{ExecContext, Result, Tensor};

#[derive(Module)]
struct Head {
    proj: Linear,
    scale: Parameter,
}

#[derive(Module)]
struct Net {
    embed: Linear,
    layers: Vec<Linear>,
    head: Box<Head>,
    extra: Option<Linear>,
    missing: Option<Linear>,
    drop: Dropout,
    #[module(skip)]
    width: usize,
}

#[derive(Module)]
struct Pair(Linear, Sequential);

impl Net {
    fn new(ctx: &ExecContext, seed: u64) -> Result<Net> {
        let width = 4;
        Ok(Net {
            embed: Linear::new(ctx, 3, width, seed)?,
            layers: (0..2)
                .map(|i| Linear::new(ctx, width, width, seed + 10 + i))
                .collect::<Result<_>>()?,
            head: Box::new(Head {
                proj: Linear::new(ctx, width, 2, seed + 20)?,
                scale: Parameter::from_slice(ctx, &[1], &[1.5])?,
            }),
            extra: Some(Linear::no_bias(ctx, 2, 2, seed + 30)?),
            missing: None,
            drop: Dropout::new(0.5, seed + 40)?,
            width,
        })
    }

    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        let mut h = self.embed.forward(ctx, x)?.relu(ctx)?;
        for l in &self.layers {
            h = l.forward(ctx, &h)?.relu(ctx)?;
        }
        let h = self.drop.forward(ctx, &h)?;
        let y = self.head.proj.forward(ctx, &h)?;
        let y = y.mul(ctx, &self.head.scale.tensor())?;
        match &self.extra {
            Some(e) => e.forward(ctx, &y),
            None => Ok(y),
        }
    }
}

#[test]
fn derived_names_are_stable_and_dotted() {
    let ctx = ExecContext::new();
    let net = Net::new(&ctx, 1).unwrap();
    assert_eq!(net.width, 4);
    let names: Vec<String> = net.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "embed.weight",
            "embed.bias",
            "layers.0.weight",
            "layers.0.bias",
            "layers.1.weight",
            "layers.1.bias",
            "head.proj.weight",
            "head.proj.bias",
            "head.scale",
            "extra.weight",
        ]
    );
    // The handles are the layers' own parameters.
    assert!(net.parameters()[2].ptr_eq(&net.layers[0].weight));
    assert_eq!(
        net.num_parameters(),
        3 * 4 + 4 + 2 * (16 + 4) + 8 + 2 + 1 + 4
    );

    let pair = Pair(
        Linear::new(&ctx, 2, 2, 1).unwrap(),
        Sequential::new().push(Linear::new(&ctx, 2, 1, 2).unwrap()),
    );
    let names: Vec<String> = pair
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["0.weight", "0.bias", "1.0.weight", "1.0.bias"]);
}

#[test]
fn derived_train_reaches_nested_dropout() {
    let ctx = ExecContext::new();
    let mut net = Net::new(&ctx, 1).unwrap();
    let x = Tensor::ones(&ctx, &[64, 3]).unwrap();
    net.eval();
    let a = net.forward(&ctx, &x).unwrap().to_vec();
    let b = net.forward(&ctx, &x).unwrap().to_vec();
    assert_eq!(a, b, "eval mode: dropout passes its input through");
    // Every row is the same in eval mode; in training mode dropout masks
    // differ across rows.
    net.train(true);
    let t = net.forward(&ctx, &x).unwrap().to_vec();
    assert!(
        t.chunks(2).any(|r| r != &t[..2]),
        "train mode: dropout active"
    );
}

#[test]
fn a_derived_model_round_trips_through_save_module() {
    let ctx = ExecContext::with_threads(1);
    let net = Net::new(&ctx, 1).unwrap();
    let mut opt = AdamW::new(net.parameters(), 0.01).unwrap();
    let x = Tensor::ones(&ctx, &[2, 3]).unwrap();
    net.forward(&ctx, &x)
        .unwrap()
        .sum_all(&ctx)
        .unwrap()
        .backward(&ctx)
        .unwrap();
    opt.step(&ctx).unwrap();
    let path =
        std::env::temp_dir().join(format!("fucina-derive-{}.safetensors", std::process::id()));
    checkpoint::save_module(&path, &net, Some(&opt), &[]).unwrap();
    let back = Net::new(&ctx, 77).unwrap();
    let mut back_opt = AdamW::new(back.parameters(), 0.01).unwrap();
    checkpoint::load_module(&ctx, &path, &back, Some(&mut back_opt)).unwrap();
    let bits = |m: &Net| -> Vec<Vec<u32>> {
        m.parameters()
            .iter()
            .map(|p| p.to_vec().iter().map(|v| v.to_bits()).collect())
            .collect()
    };
    assert_eq!(bits(&back), bits(&net));
    assert_eq!(back_opt.step_count(), 1);
    std::fs::remove_file(&path).ok();
}
