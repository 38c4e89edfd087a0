//! The learning-rate schedules against PyTorch's schedulers
//! (fixtures/lr_schedules.txt, written by fixtures/lr_schedules.py): the
//! rate of every step, a plateau scheduler's rates for a metric, its state
//! round trip, and bad arguments as errors.

use std::collections::HashMap;

use fucina::optim::{
    Anneal, ExponentialLr, LinearLr, LrSchedule, MultiStepLr, OneCycleLr, PlateauMode,
    ReduceLrOnPlateau, StepLr, WarmupCosine, WithWarmup,
};
use fucina::{Error, ExecContext};

fn fixture() -> HashMap<String, Vec<f64>> {
    include_str!("fixtures/lr_schedules.txt")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let mut w = l.split_whitespace();
            let name = w.next().unwrap().to_string();
            (name, w.map(|v| v.parse().unwrap()).collect())
        })
        .collect()
}

fn close(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= 1e-6 * (1.0 + w.abs()),
            "{what} step {i}: got {g}, PyTorch {w}"
        );
    }
}

fn rates(s: &dyn LrSchedule, n: usize) -> Vec<f32> {
    (0..n as u64).map(|i| s.lr(i)).collect()
}

#[test]
fn schedules_match_pytorch() {
    let f = fixture();
    let check = |name: &str, s: &dyn LrSchedule| {
        let want = &f[name];
        close(name, &rates(s, want.len()), want);
    };
    check("step_7_0.5", &StepLr::new(0.5, 7, 0.5).unwrap());
    check(
        "multistep_5_5_20_0.3",
        &MultiStepLr::new(0.5, &[20, 5, 5], 0.3).unwrap(),
    );
    check("exponential_0.9", &ExponentialLr::new(0.5, 0.9).unwrap());
    check(
        "linear_0.2_0.9_10",
        &LinearLr::new(0.5, 0.2, 0.9, 10).unwrap(),
    );
    check("onecycle_2.0_50", &OneCycleLr::new(2.0, 50).unwrap());
    let mut three = OneCycleLr::new(2.0, 40).unwrap();
    three.anneal = Anneal::Linear;
    three.three_phase = true;
    three.pct_start = 0.25;
    three.div_factor = 10.0;
    three.final_div_factor = 100.0;
    three.validate().unwrap();
    check("onecycle3_lin_2.0_40", &three);
    check(
        "warmup_5_0.1_step_10_0.5",
        &WithWarmup::new(StepLr::new(0.5, 10, 0.5).unwrap(), 5, 0.1).unwrap(),
    );
}

#[test]
fn plateau_matches_pytorch_and_its_state_round_trips() {
    let f = fixture();
    let ctx = ExecContext::new();
    let mut a = ReduceLrOnPlateau::new(0.5).unwrap();
    (a.patience, a.cooldown, a.factor, a.min_lr) = (3, 2, 0.5, 0.01);
    let mut b = ReduceLrOnPlateau::new(0.5).unwrap();
    (b.mode, b.patience, b.factor) = (PlateauMode::Max, 2, 0.3);
    for (s, metric, want) in [
        (&mut a, "metric_min", "plateau_min_p3_c2"),
        (&mut b, "metric_max", "plateau_max_p2"),
    ] {
        let m = &f[metric];
        let mut got = vec![s.lr()];
        let mut resumed: Option<ReduceLrOnPlateau> = None;
        for (i, &v) in m[..m.len() - 1].iter().enumerate() {
            // Halfway, continue in a copy restored from the saved state.
            if i == m.len() / 2 {
                let mut r = s.clone();
                r.load_state_dict(
                    &ReduceLrOnPlateau::new(9.0)
                        .unwrap()
                        .state_dict(&ctx)
                        .unwrap(),
                )
                .unwrap();
                assert_eq!(r.lr(), 9.0);
                r.load_state_dict(&s.state_dict(&ctx).unwrap()).unwrap();
                resumed = Some(r);
            }
            let lr = match resumed.as_mut() {
                Some(r) => r.step(v),
                None => s.step(v),
            };
            got.push(lr);
        }
        close(want, &got, &f[want]);
    }
}

#[test]
fn warmup_cosine_is_a_schedule_and_bad_arguments_are_errors() {
    let w = WarmupCosine::new(1.0, 0.0, 10, 110).unwrap();
    let s: &dyn LrSchedule = &w;
    assert_eq!(s.lr(5), w.lr(5));
    let invalid = |r: fucina::Result<()>| assert!(matches!(r, Err(Error::InvalidArgument { .. })));
    invalid(StepLr::new(0.1, 0, 0.5).map(drop));
    invalid(StepLr::new(-0.1, 1, 0.5).map(drop));
    invalid(StepLr::new(0.1, 1, f32::NAN).map(drop));
    invalid(MultiStepLr::new(0.1, &[1], 0.0).map(drop));
    invalid(ExponentialLr::new(f32::INFINITY, 0.9).map(drop));
    invalid(LinearLr::new(0.1, 0.0, 1.0, 5).map(drop));
    invalid(LinearLr::new(0.1, 0.5, 1.5, 5).map(drop));
    invalid(LinearLr::new(0.1, 0.5, 1.0, 0).map(drop));
    invalid(OneCycleLr::new(1.0, 0).map(drop));
    let mut o = OneCycleLr::new(1.0, 10).unwrap();
    o.pct_start = 1.5;
    invalid(o.validate());
    invalid(WithWarmup::new(StepLr::new(0.1, 1, 0.5).unwrap(), 3, 0.0).map(drop));
    invalid(ReduceLrOnPlateau::new(f32::NAN).map(drop));
    let mut p = ReduceLrOnPlateau::new(0.1).unwrap();
    invalid(p.load_state_dict(&fucina::nn::StateDict::new()));
    assert_eq!(p.lr(), 0.1);
    // Past total_steps a 1cycle schedule holds its last rate.
    let c = OneCycleLr::new(1.0, 20).unwrap();
    assert_eq!(c.lr(25), c.lr(20));
}
