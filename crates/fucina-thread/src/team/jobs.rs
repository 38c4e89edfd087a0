//! The job adapters of chunks mode: each parallel call (`parallel_chunks`,
//! `parallel_chunks_mut`, `parallel_for`, `parallel_for_slices`) becomes an
//! [`IndexedJob`] (task `i` of a slice, of a mutable slice, of a range, of a
//! chunked output) holding its closure [`Inline`] or [`ByRef`], and
//! [`run_chunks`] runs one participant's share of such a job: its static task,
//! then dynamic claims of [`claim_chunk`] tasks (team/README.md, "Job shares").

use super::PanicSlot;
use super::dispatch::{Payload, Share, seat_bit};
use crate::chunking::ChunkRanges;
use crate::sync::Ordering;
use std::ops::Range;

/// The dynamic claim chunk for `count` tasks on `p` participants: how many
/// tasks one claim of the shared counter takes (see `team/README.md`).
pub(crate) fn claim_chunk(count: usize, p: usize) -> usize {
    if count <= p.saturating_mul(4) {
        1
    } else if count <= p.saturating_mul(16) {
        2
    } else {
        4
    }
}

/// A chunks-mode job: what runs task `i`, moved into the job descriptor on
/// the generation line (raw pointers into the caller's stack, and the closure
/// itself when it fits, so a worker's first access after the generation line
/// is the task's own data).
pub(super) trait IndexedJob {
    /// Runs task `i`.
    ///
    /// # Safety
    /// `i` is below the job's task count, each `i` is run at most once per
    /// dispatch, and the pointers inside are live.
    unsafe fn call(&self, i: usize);
}

/// How a job holds its closure: [`Inline`] (moved into the job, when it fits
/// the payload) or [`ByRef`] (a pointer to the caller's).
pub(super) trait Holder {
    /// The closure type.
    type F;

    /// The closure.
    ///
    /// # Safety
    /// For [`ByRef`], the closure it points to must be live.
    unsafe fn get(&self) -> &Self::F;
}

/// The closure, moved into the job.
pub(super) struct Inline<F>(pub(super) F);

impl<F> Holder for Inline<F> {
    type F = F;
    #[inline(always)]
    unsafe fn get(&self) -> &F {
        &self.0
    }
}

/// A pointer to the caller's closure (it did not fit the payload).
pub(super) struct ByRef<F>(pub(super) *const F);

impl<F> Holder for ByRef<F> {
    type F = F;
    #[inline(always)]
    unsafe fn get(&self) -> &F {
        // SAFETY: the caller guarantees the closure is live.
        unsafe { &*self.0 }
    }
}

/// `parallel_chunks`: task `i` is `run(&tasks[i])`.
pub(super) struct SliceJob<T, H> {
    pub(super) tasks: *const T,
    pub(super) run: H,
}

impl<T: Sync, H: Holder> IndexedJob for SliceJob<T, H>
where
    H::F: Fn(&T) + Sync,
{
    #[inline(always)]
    unsafe fn call(&self, i: usize) {
        // SAFETY: the caller guarantees `i < tasks.len()` and that the slice and
        // the closure are live; both are `Sync`, so shared use from any thread is fine.
        unsafe { (self.run.get())(&*self.tasks.add(i)) }
    }
}

/// `parallel_chunks_mut`: task `i` is `run(&mut items[i])`.
pub(super) struct MutSliceJob<T, H> {
    pub(super) items: *mut T,
    pub(super) run: H,
}

impl<T: Send, H: Holder> IndexedJob for MutSliceJob<T, H>
where
    H::F: Fn(&mut T) + Sync,
{
    #[inline(always)]
    unsafe fn call(&self, i: usize) {
        // SAFETY: the caller guarantees `i < items.len()`, that the slice and
        // the closure are live, and that each `i` is called once per dispatch
        // (P3 of team/README.md), so this `&mut` is the only reference to
        // element `i`; `T: Send` lets it be used on another thread.
        unsafe { (self.run.get())(&mut *self.items.add(i)) }
    }
}

/// `parallel_for_slices`: task `i` is `f(chunk i, &mut out[chunk i])`, the
/// chunks being those of `chunk_ranges(0, len, ..)`: chunk `i` is
/// `[i * size, min((i + 1) * size, len))`.
pub(super) struct SlicesJob<T, H> {
    pub(super) out: *mut T,
    pub(super) size: usize,
    pub(super) len: usize,
    pub(super) f: H,
}

impl<T: Send, H: Holder> IndexedJob for SlicesJob<T, H>
where
    H::F: Fn(Range<usize>, &mut [T]) + Sync,
{
    #[inline(always)]
    unsafe fn call(&self, i: usize) {
        // No overflow: chunk `i` exists, so `i * size < len`.
        let lo = i * self.size;
        let hi = lo.saturating_add(self.size).min(self.len);
        // SAFETY: the caller guarantees chunk `i` exists (so `lo..hi` lies in
        // `out`), that `out` and the closure are live, and that each `i` is
        // called once per dispatch: the chunks are disjoint, so this `&mut`
        // slice is the only reference to its elements; `T: Send`.
        unsafe {
            (self.f.get())(
                lo..hi,
                std::slice::from_raw_parts_mut(self.out.add(lo), hi - lo),
            )
        }
    }
}

/// `parallel_for`: task `i` is `f(chunk i)`, chunk `i` being
/// `[begin + i * size, min(begin + (i + 1) * size, end))` ([`ChunkRanges::get`]).
pub(super) struct RangeJob<H> {
    begin: usize,
    size: usize,
    end: usize,
    f: H,
}

impl<H> RangeJob<H> {
    /// The job for the chunks of `chunks` (at least one).
    pub(super) fn new(chunks: &ChunkRanges, f: H) -> Self {
        let first = chunks.get(0).unwrap_or(0..0);
        RangeJob {
            begin: first.start,
            size: chunks.chunk_size(),
            end: chunks.clone().last().map_or(first.end, |r| r.end),
            f,
        }
    }

    /// Chunk `i` (`i` below the chunk count).
    #[inline(always)]
    pub(super) fn range(&self, i: usize) -> Range<usize> {
        // No overflow: chunk `i` exists, so `begin + i * size < end`.
        let lo = self.begin + i * self.size;
        lo..lo.saturating_add(self.size).min(self.end)
    }
}

impl<H: Holder> IndexedJob for RangeJob<H>
where
    H::F: Fn(Range<usize>) + Sync,
{
    #[inline(always)]
    unsafe fn call(&self, i: usize) {
        // SAFETY: the caller guarantees the closure is live; it is `Sync`.
        unsafe { (self.f.get())(self.range(i)) }
    }
}

/// One participant's share of a chunks job: participant `p` first runs task
/// `p` (its static task, no atomic), then claims `chunk` indices at a time
/// from the dynamic part `participants..count` (team/README.md, "Job shares").
/// With [`Share::steal`] set (the dispatcher, after closing the seat), it runs
/// only the static tasks of the workers that never entered.
///
/// # Safety
/// `payload` must hold a `C` whose pointers are live, for `share.count` tasks.
pub(super) unsafe fn run_chunks<C: IndexedJob>(payload: &Payload, share: Share<'_>) {
    // SAFETY: the caller passes the payload this function was made for, in
    // place in the job descriptor.
    let job = unsafe { payload.get_ref::<C>() };
    let Share {
        index,
        participants,
        next,
        count,
        panic,
        tracer,
        steal,
    } = share;
    if steal != 0 {
        return steal_static_tasks(job, count, participants, panic, tracer, steal);
    }
    if let Some(t) = tracer {
        t.claimed();
    }
    let mut ran = 0u64;
    if index < count {
        // SAFETY: `index < count`; the caller keeps the job's data live.
        panic.catch(|| unsafe { job.call(index) });
        ran += 1;
    }
    if count > participants {
        let chunk = claim_chunk(count, participants);
        // `count <= MAX_CHUNKS_COUNT` (run_job), and `next` starts at 0 and
        // grows by at most `chunk` per participant past `count - participants`,
        // so neither the claim nor `start + chunk` can overflow.
        loop {
            let claim = next.fetch_add(chunk, Ordering::Relaxed);
            let start = participants + claim;
            if start >= count {
                break;
            }
            let end = count.min(start + chunk);
            for i in start..end {
                // SAFETY: `i < count`; the caller keeps the job's data live.
                panic.catch(|| unsafe { job.call(i) });
            }
            ran += (end - start) as u64;
        }
    }
    if let Some(t) = tracer {
        t.completed(ran);
    }
}

/// Runs the static tasks of the absent workers (`steal`: their seat bits),
/// on the dispatcher, after the seat closed.
#[cold]
#[inline(never)]
fn steal_static_tasks<C: IndexedJob>(
    job: &C,
    count: usize,
    participants: usize,
    panic: &PanicSlot,
    tracer: Option<crate::profile::Tracer<'_>>,
    steal: u64,
) {
    let mut ran = 0u64;
    for worker in 1..participants.min(count) {
        if steal & seat_bit(worker) != 0 {
            // SAFETY: `worker < count`; the worker never entered the job and
            // cannot any more (closed seat), so this static task runs once.
            panic.catch(|| unsafe { job.call(worker) });
            ran += 1;
        }
    }
    if let Some(t) = tracer {
        t.completed_more(ran);
    }
}
