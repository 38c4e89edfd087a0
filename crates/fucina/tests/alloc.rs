//! Steady-state optimizer steps allocate nothing on the heap (a counting global
//! allocator around `step`).
//!
//! Only the allocations of the thread that runs the step are counted (the
//! contexts here have one thread): the test harness's own threads may allocate
//! at any moment, for example to report a test that runs slowly on a loaded
//! machine, and must not make the count flaky.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use fucina::nn::{Linear, Module};
use fucina::optim::{
    Adagrad, AdagradConfig, AdamW, AdamWConfig, Lion, Optimizer, RmsProp, RmsPropConfig, Sgd,
    SgdConfig, clip_grad_norm,
};
use fucina::{ExecContext, Tensor};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread's allocations are counted (const-initialized: reading
    /// it never allocates).
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTED.with(Cell::get) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged; the counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc`/`realloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `GlobalAlloc::alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_of_steps(
    ctx: &ExecContext,
    opt: &mut dyn Optimizer,
    model: &[Linear],
    clip: bool,
) -> usize {
    let x = Tensor::from_slice(ctx, &[8, 16], &[0.25; 128]).unwrap();
    let labels = ctx
        .from_slice_typed::<i64>(&[8], &[0, 1, 2, 3, 0, 1, 2, 3])
        .unwrap();
    let mut counted = 0;
    for step in 0..6 {
        let scope = ctx.open_exec_scope();
        let h = model[0].forward(ctx, &x).unwrap().relu(ctx).unwrap();
        let loss = model[1]
            .forward(ctx, &h)
            .unwrap()
            .cross_entropy(ctx, &labels)
            .unwrap();
        loss.backward(ctx).unwrap();
        drop((h, loss));
        ctx.close_exec_scope(scope);
        if clip {
            clip_grad_norm(ctx, opt.parameters(), 1e9).unwrap();
        }
        let before = ALLOCS.load(Ordering::Relaxed);
        COUNTED.with(|c| c.set(true));
        opt.step(ctx).unwrap();
        COUNTED.with(|c| c.set(false));
        let after = ALLOCS.load(Ordering::Relaxed);
        opt.zero_grad();
        if step >= 2 {
            counted += after - before;
        }
    }
    counted
}

fn model(ctx: &ExecContext) -> (Vec<Linear>, Vec<fucina::nn::Parameter>) {
    let m = vec![
        Linear::new(ctx, 16, 32, 1).unwrap(),
        Linear::new(ctx, 32, 4, 2).unwrap(),
    ];
    let p = m.iter().flat_map(Module::parameters).collect();
    (m, p)
}

#[test]
fn steady_state_steps_do_not_allocate() {
    let ctx = ExecContext::with_threads(1);
    let (m, p) = model(&ctx);
    let mut adamw = AdamW::new(p, AdamWConfig::default()).unwrap();
    assert_eq!(allocations_of_steps(&ctx, &mut adamw, &m, true), 0, "AdamW");
    let (m, p) = model(&ctx);
    let cfg = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        nesterov: true,
        weight_decay: 1e-4,
        ..SgdConfig::default()
    };
    let mut sgd = Sgd::new(p, cfg).unwrap();
    assert_eq!(allocations_of_steps(&ctx, &mut sgd, &m, false), 0, "SGD");
    let (m, p) = model(&ctx);
    let cfg = RmsPropConfig {
        momentum: 0.9,
        centered: true,
        weight_decay: 1e-4,
        ..RmsPropConfig::default()
    };
    let mut rms = RmsProp::new(p, cfg).unwrap();
    assert_eq!(
        allocations_of_steps(&ctx, &mut rms, &m, false),
        0,
        "RMSprop"
    );
    let (m, p) = model(&ctx);
    let cfg = AdagradConfig {
        lr_decay: 0.01,
        initial_accumulator_value: 0.1,
        ..AdagradConfig::default()
    };
    let mut adagrad = Adagrad::new(p, cfg).unwrap();
    assert_eq!(
        allocations_of_steps(&ctx, &mut adagrad, &m, false),
        0,
        "Adagrad"
    );
    let (m, p) = model(&ctx);
    let mut lion = Lion::new(p, 1e-4).unwrap();
    assert_eq!(allocations_of_steps(&ctx, &mut lion, &m, true), 0, "Lion");
}
