//! Parameter groups: per-group weight decay for AdamW / Adam / Sgd, recorded
//! in and restored from the optimizer state.

use fucina::nn::{Linear, Module, Parameter};
use fucina::optim::{AdamW, AdamWConfig, Optimizer, ParamGroup, Sgd, SgdConfig, decay_groups};
use fucina::{Error, ExecContext};

fn bits(p: &Parameter) -> Vec<u32> {
    p.to_vec().iter().map(|v| v.to_bits()).collect()
}

#[path = "../../fucina-autograd/tests/support/square.rs"]
mod square;

fn grads(ctx: &ExecContext, params: &[Parameter]) {
    for p in params {
        p.zero_grad();
        square::backward_sum_of_squares(ctx, &p.tensor());
    }
}

/// Three steps of `grouped` on `fc` and of the per-group `twins` on `twin`
/// (a copy of `fc`), each after the same gradients: the same bits.
fn three_steps_agree(
    ctx: &ExecContext,
    fc: &Linear,
    grouped: &mut dyn Optimizer,
    twin: &Linear,
    twins: &mut [&mut dyn Optimizer],
) {
    for _ in 0..3 {
        grads(ctx, &fc.parameters());
        grouped.step(ctx).unwrap();
        grads(ctx, &twin.parameters());
        for opt in twins.iter_mut() {
            opt.step(ctx).unwrap();
        }
    }
    assert_eq!(bits(&fc.weight), bits(&twin.weight));
    assert_eq!(
        bits(fc.bias.as_ref().unwrap()),
        bits(twin.bias.as_ref().unwrap())
    );
}

fn cfg() -> AdamWConfig {
    AdamWConfig {
        lr: 0.1,
        weight_decay: 0.5,
        ..AdamWConfig::default()
    }
}

#[test]
fn each_group_gets_its_own_weight_decay() {
    let ctx = ExecContext::with_threads(1);
    let fc = Linear::new(&ctx, 3, 2, 1).unwrap();
    let mut grouped = AdamW::with_groups(decay_groups(fc.parameters()), cfg()).unwrap();
    // The same steps with one optimizer per group.
    let twin = Linear::new(&ctx, 3, 2, 1).unwrap();
    let mut w_opt = AdamW::new(vec![twin.weight.clone()], cfg()).unwrap();
    let mut b_opt = AdamW::new(
        vec![twin.bias.clone().unwrap()],
        AdamWConfig {
            weight_decay: 0.0,
            ..cfg()
        },
    )
    .unwrap();
    three_steps_agree(
        &ctx,
        &fc,
        &mut grouped,
        &twin,
        &mut [&mut w_opt, &mut b_opt],
    );
    // And the bias did not decay as the weight did: an ungrouped run differs.
    let plain = Linear::new(&ctx, 3, 2, 1).unwrap();
    let mut p_opt = AdamW::new(plain.parameters(), cfg()).unwrap();
    for _ in 0..3 {
        grads(&ctx, &plain.parameters());
        p_opt.step(&ctx).unwrap();
    }
    assert_ne!(
        bits(fc.bias.as_ref().unwrap()),
        bits(plain.bias.as_ref().unwrap())
    );
}

#[test]
fn the_grouping_is_saved_in_the_state_and_checked_on_load() {
    let ctx = ExecContext::with_threads(1);
    let fc = Linear::new(&ctx, 3, 2, 1).unwrap();
    let groups = vec![
        ParamGroup::new(vec![fc.weight.clone()]).with_weight_decay(0.25),
        ParamGroup::new(vec![fc.bias.clone().unwrap()]).with_weight_decay(0.0),
    ];
    let mut opt = AdamW::with_groups(groups, cfg()).unwrap();
    grads(&ctx, &fc.parameters());
    opt.step(&ctx).unwrap();
    let sd = opt.state_dict();
    assert_eq!(sd.get("param_groups").unwrap().to_vec(), [0.0, 1.0]);
    assert_eq!(sd.get("group_weight_decay").unwrap().to_vec(), [0.25, 0.0]);

    // A fresh grouped optimizer with other decays takes the saved decays.
    let other = vec![
        ParamGroup::new(vec![fc.weight.clone()]).with_weight_decay(0.9),
        ParamGroup::new(vec![fc.bias.clone().unwrap()]).with_weight_decay(0.9),
    ];
    let mut back = AdamW::with_groups(other, cfg()).unwrap();
    back.load_state_dict(&ctx, &sd).unwrap();
    assert_eq!(
        back.state_dict()
            .get("group_weight_decay")
            .unwrap()
            .to_vec(),
        [0.25, 0.0]
    );

    // An ungrouped optimizer refuses a grouped state, and the reverse.
    let mut plain = AdamW::new(fc.parameters(), cfg()).unwrap();
    let err = plain.load_state_dict(&ctx, &sd).unwrap_err();
    assert!(
        matches!(err, Error::StateDict { .. }) && err.to_string().contains("param_groups"),
        "{err}"
    );
    grads(&ctx, &fc.parameters());
    plain.step(&ctx).unwrap();
    let err = back.load_state_dict(&ctx, &plain.state_dict()).unwrap_err();
    assert!(
        err.to_string().contains("missing entry \"param_groups\""),
        "{err}"
    );
    // Grouped differently: refused, nothing changes.
    let regrouped = vec![ParamGroup::new(fc.parameters())];
    let mut one = AdamW::with_groups(regrouped, cfg()).unwrap();
    let err = one.load_state_dict(&ctx, &sd).unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
    assert_eq!(one.step_count(), 0);
    // An empty list resets a grouped optimizer.
    back.load_state_dict(&ctx, &[]).unwrap();
    assert_eq!(back.step_count(), 0);
}

#[test]
fn sgd_groups_and_bad_decays() {
    let ctx = ExecContext::with_threads(1);
    let fc = Linear::new(&ctx, 2, 2, 3).unwrap();
    let sgd_cfg = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.3,
        ..SgdConfig::default()
    };
    let mut grouped = Sgd::with_groups(decay_groups(fc.parameters()), sgd_cfg).unwrap();
    let twin = Linear::new(&ctx, 2, 2, 3).unwrap();
    let mut w = Sgd::new(vec![twin.weight.clone()], sgd_cfg).unwrap();
    let mut b = Sgd::new(
        vec![twin.bias.clone().unwrap()],
        SgdConfig {
            weight_decay: 0.0,
            ..sgd_cfg
        },
    )
    .unwrap();
    three_steps_agree(&ctx, &fc, &mut grouped, &twin, &mut [&mut w, &mut b]);
    let sd = grouped.state_dict();
    let mut back = Sgd::with_groups(decay_groups(fc.parameters()), sgd_cfg).unwrap();
    back.load_state_dict(&ctx, &sd).unwrap();
    assert_eq!(back.step_count(), 3);

    let bad = vec![ParamGroup::new(fc.parameters()).with_weight_decay(-1.0)];
    assert!(matches!(
        Sgd::with_groups(bad.clone(), 0.1),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(AdamW::with_groups(bad, 0.1).is_err());
    // A parameter in two groups is refused.
    let twice = vec![
        ParamGroup::new(fc.parameters()),
        ParamGroup::new(vec![fc.weight.clone()]),
    ];
    assert!(AdamW::with_groups(twice, 0.1).is_err());
}
