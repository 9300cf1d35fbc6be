//! A host backend that behaves like the device backend where memory lifetimes matter, for
//! testing zgrad's memory policy on the CPU: every tensor is tagged with the allocation class
//! it was made in, a scratch allocation with no step open is refused (as the CUDA backend's
//! `NoOpenStep`), and ending a step poisons (fills with NaN) every scratch buffer the step
//! allocated, live or not, as a reset that hands memory out again would. Saved and persistent
//! memory is never touched. Captures record the body and replay it (and can be made to fail).

#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use zcompute::{
    AdamWConfig, AllocClass, BinaryOp, ComputeError, CpuBackend, CpuStorage, CpuTensor, Element,
    LayerNormOut, Layout, MatmulOpts, ReduceOp, ScalarSide, Storage, Tensor, UnaryOp,
};
use zcompute::{
    AttentionOps, Backend, Capture, LinearOps, NormOps, OptimOps, PooledLossOps, PrecisionOps,
    RandomOps, ReadbackOps, SelectOps, SgdConfig, StepOps,
};

#[derive(Clone, Debug)]
pub struct Tagged<T: Element> {
    inner: CpuStorage<T>,
    pub class: AllocClass,
}

impl<T: Element> Storage for Tagged<T> {
    type Elem = T;
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn same_buffer(&self, other: &Self) -> bool {
        self.inner.same_buffer(&other.inner)
    }
}

pub type TTensor<T> = Tensor<Tagged<T>>;

/// What the backend saw.
#[derive(Debug, Default)]
pub struct Log {
    pub steps_begun: Cell<u64>,
    pub steps_ended: Cell<u64>,
    pub allocs: RefCell<[u64; 4]>,
    pub poisoned: Cell<u64>,
}

#[derive(Debug, Default)]
pub struct SimBackend<T: Element> {
    class: Cell<Option<AllocClass>>,
    open: Cell<bool>,
    step_scratch: RefCell<Vec<CpuStorage<T>>>,
    pub log: Log,
    /// Capture fails: `Some(false)` before running the body, `Some(true)` after running it.
    pub fail_capture: Cell<Option<bool>>,
    pub captures: Cell<u64>,
}

pub struct SimGraph {
    body: Box<dyn FnMut() -> zcompute::Result<()>>,
}

const CPU: CpuBackend = CpuBackend;

fn inner<T: Element>(t: &TTensor<T>) -> CpuTensor<T> {
    // The layout was valid over this very storage.
    CpuTensor::from_parts(t.storage().inner.clone(), t.layout().clone()).unwrap()
}

impl<T: Element> SimBackend<T>
where
    CpuBackend: Backend<T, Storage = CpuStorage<T>>,
{
    pub fn new() -> Self {
        SimBackend {
            class: Cell::new(Some(AllocClass::Scratch)),
            ..Default::default()
        }
    }

    fn current(&self) -> AllocClass {
        self.class.get().unwrap_or(AllocClass::Scratch)
    }

    fn wrap(&self, op: &'static str, t: CpuTensor<T>) -> zcompute::Result<TTensor<T>> {
        let class = self.current();
        if class == AllocClass::Scratch {
            if !self.open.get() {
                return Err(ComputeError::NoOpenStep { op });
            }
            self.step_scratch.borrow_mut().push(t.storage().clone());
        }
        self.log.allocs.borrow_mut()[class as usize] += 1;
        TTensor::from_parts(
            Tagged {
                inner: t.storage().clone(),
                class,
            },
            t.layout().clone(),
        )
    }

    pub fn allocs(&self, class: AllocClass) -> u64 {
        self.log.allocs.borrow()[class as usize]
    }
}

impl<T: Element> Backend<T> for SimBackend<T>
where
    CpuBackend: Backend<T, Storage = CpuStorage<T>>,
{
    type Storage = Tagged<T>;

    fn name(&self) -> &'static str {
        "sim"
    }
    fn upload(&self, data: &[T], shape: &[usize]) -> zcompute::Result<TTensor<T>> {
        self.wrap("upload", CPU.upload(data, shape)?)
    }
    fn upload_into(&self, data: &[T], dst: &TTensor<T>) -> zcompute::Result<()> {
        CPU.upload_into(data, &inner(dst))
    }
    fn download(&self, x: &TTensor<T>) -> zcompute::Result<Vec<T>> {
        CPU.download(&inner(x))
    }
    fn full(&self, shape: &[usize], value: T) -> zcompute::Result<TTensor<T>> {
        self.wrap("full", CPU.full(shape, value)?)
    }
    fn fill(&self, dst: &TTensor<T>, value: T) -> zcompute::Result<()> {
        CPU.fill(&inner(dst), value)
    }
    fn contiguous(&self, x: &TTensor<T>) -> zcompute::Result<TTensor<T>> {
        self.wrap("contiguous", CPU.contiguous(&inner(x))?)
    }
    fn copy_into(&self, src: &TTensor<T>, dst: &TTensor<T>) -> zcompute::Result<()> {
        CPU.copy_into(&inner(src), &inner(dst))
    }
    fn unary(&self, op: UnaryOp, x: &TTensor<T>) -> zcompute::Result<TTensor<T>> {
        self.wrap("unary", CPU.unary(op, &inner(x))?)
    }
    fn binary(&self, op: BinaryOp, a: &TTensor<T>, b: &TTensor<T>) -> zcompute::Result<TTensor<T>> {
        self.wrap("binary", CPU.binary(op, &inner(a), &inner(b))?)
    }
    fn binary_scalar(
        &self,
        op: BinaryOp,
        x: &TTensor<T>,
        s: T,
        side: ScalarSide,
    ) -> zcompute::Result<TTensor<T>> {
        self.wrap("binary_scalar", CPU.binary_scalar(op, &inner(x), s, side)?)
    }
    fn reduce(
        &self,
        op: ReduceOp,
        x: &TTensor<T>,
        axis: usize,
        keepdim: bool,
    ) -> zcompute::Result<TTensor<T>> {
        self.wrap("reduce", CPU.reduce(op, &inner(x), axis, keepdim)?)
    }
    fn softmax_last(&self, x: &TTensor<T>) -> zcompute::Result<TTensor<T>> {
        self.wrap("softmax", CPU.softmax_last(&inner(x))?)
    }
    fn layer_norm(
        &self,
        x: &TTensor<T>,
        weight: Option<&TTensor<T>>,
        bias: Option<&TTensor<T>>,
        eps: T,
    ) -> zcompute::Result<LayerNormOut<Tagged<T>>> {
        let w = weight.map(inner);
        let b = bias.map(inner);
        let out = CPU.layer_norm(&inner(x), w.as_ref(), b.as_ref(), eps)?;
        Ok(LayerNormOut {
            out: self.wrap("layer_norm", out.out)?,
            mean: self.wrap("layer_norm", out.mean)?,
            rstd: self.wrap("layer_norm", out.rstd)?,
        })
    }
    fn matmul(
        &self,
        a: &TTensor<T>,
        b: &TTensor<T>,
        o: MatmulOpts,
    ) -> zcompute::Result<TTensor<T>> {
        self.wrap("matmul", CPU.matmul(&inner(a), &inner(b), o)?)
    }
    fn bce_with_logits_mean(&self, l: &TTensor<T>, t: &TTensor<T>) -> zcompute::Result<TTensor<T>> {
        self.wrap("bce", CPU.bce_with_logits_mean(&inner(l), &inner(t))?)
    }
    fn adamw_step(
        &self,
        p: &TTensor<T>,
        m: &TTensor<T>,
        v: &TTensor<T>,
        g: &TTensor<T>,
        slot: &TTensor<T>,
        cfg: &AdamWConfig<T>,
    ) -> zcompute::Result<()> {
        CPU.adamw_step(
            &inner(p),
            &inner(m),
            &inner(v),
            &inner(g),
            &inner(slot),
            cfg,
        )
    }
    fn gather_row(
        &self,
        src: &TTensor<T>,
        index: &TTensor<T>,
        dst: &TTensor<T>,
    ) -> zcompute::Result<()> {
        CPU.gather_row(&inner(src), &inner(index), &inner(dst))
    }
    fn scatter_row(
        &self,
        src: &TTensor<T>,
        index: &TTensor<T>,
        dst: &TTensor<T>,
        advance: bool,
    ) -> zcompute::Result<()> {
        CPU.scatter_row(&inner(src), &inner(index), &inner(dst), advance)
    }
    fn set_alloc_class(&self, class: AllocClass) -> AllocClass {
        let prev = self.current();
        self.class.set(Some(class));
        prev
    }
    fn alloc_class(&self) -> AllocClass {
        self.current()
    }
    fn storage_class(&self, x: &TTensor<T>) -> Option<AllocClass> {
        Some(x.storage().class)
    }
    fn begin_step(&self) -> zcompute::Result<()> {
        if self.open.replace(true) {
            return Err(ComputeError::StepState {
                op: "begin_step",
                why: "a step is already open",
            });
        }
        self.log.steps_begun.set(self.log.steps_begun.get() + 1);
        Ok(())
    }
    fn end_step(&self) -> zcompute::Result<()> {
        if !self.open.replace(false) {
            return Err(ComputeError::StepState {
                op: "end_step",
                why: "no step is open",
            });
        }
        self.log.steps_ended.set(self.log.steps_ended.get() + 1);
        for s in self.step_scratch.borrow_mut().drain(..) {
            let all = CpuTensor::from_parts(s.clone(), Layout::contiguous(&[s.len()])).unwrap();
            CPU.fill(&all, T::from_f64(f64::NAN))?;
            self.log.poisoned.set(self.log.poisoned.get() + 1);
        }
        Ok(())
    }
}

// No fused kernels of its own: every family's composite of the primitives above.
impl<T: Element> LinearOps<T> for SimBackend<T> where CpuBackend: Backend<T, Storage = CpuStorage<T>>
{}
impl<T: Element> NormOps<T> for SimBackend<T> where CpuBackend: Backend<T, Storage = CpuStorage<T>> {}
impl<T: Element> AttentionOps<T> for SimBackend<T> where
    CpuBackend: Backend<T, Storage = CpuStorage<T>>
{
}
impl<T: Element> PooledLossOps<T> for SimBackend<T> where
    CpuBackend: Backend<T, Storage = CpuStorage<T>>
{
}
impl<T: Element> StepOps<T> for SimBackend<T> where CpuBackend: Backend<T, Storage = CpuStorage<T>> {}
impl<T: Element> ReadbackOps<T> for SimBackend<T> where
    CpuBackend: Backend<T, Storage = CpuStorage<T>>
{
}
// Float32 products only: the reduced math modes are refused (typed), never run as float32.
impl<T: Element> PrecisionOps<T> for SimBackend<T> where
    CpuBackend: Backend<T, Storage = CpuStorage<T>>
{
}

// The selection and random families have no composite: the CPU's loops, on the same memory.
impl<T: Element> SelectOps<T> for SimBackend<T>
where
    CpuBackend: Backend<T, Storage = CpuStorage<T>>,
{
    fn select(
        &self,
        cond: &TTensor<T>,
        a: &TTensor<T>,
        b: &TTensor<T>,
    ) -> zcompute::Result<TTensor<T>> {
        self.wrap("select", CPU.select(&inner(cond), &inner(a), &inner(b))?)
    }
    fn argmax(&self, x: &TTensor<T>) -> zcompute::Result<TTensor<T>> {
        self.wrap("argmax", CPU.argmax(&inner(x))?)
    }
    fn index_add_rows(
        &self,
        src: &TTensor<T>,
        index: &TTensor<T>,
        dst: &TTensor<T>,
    ) -> zcompute::Result<()> {
        CPU.index_add_rows(&inner(src), &inner(index), &inner(dst))
    }
}
impl<T: Element> RandomOps<T> for SimBackend<T>
where
    CpuBackend: Backend<T, Storage = CpuStorage<T>>,
{
    fn dropout_mask(
        &self,
        shape: &[usize],
        p: f64,
        seed: u64,
        stream: u32,
        step: &TTensor<T>,
    ) -> zcompute::Result<TTensor<T>> {
        let mask = CPU.dropout_mask(shape, p, seed, stream, &inner(step))?;
        self.wrap("dropout_mask", mask)
    }
}

impl<T: Element> OptimOps<T> for SimBackend<T>
where
    CpuBackend: Backend<T, Storage = CpuStorage<T>>,
{
    fn sgd_step(
        &self,
        p: &TTensor<T>,
        buf: Option<&TTensor<T>>,
        g: &TTensor<T>,
        slot: &TTensor<T>,
        cfg: &SgdConfig<T>,
    ) -> zcompute::Result<()> {
        let buf = buf.map(inner);
        CPU.sgd_step(&inner(p), buf.as_ref(), &inner(g), &inner(slot), cfg)
    }
}

impl<T: Element> Capture<T> for SimBackend<T>
where
    CpuBackend: Backend<T, Storage = CpuStorage<T>>,
{
    type Graph = SimGraph;

    fn capture(
        &self,
        mut body: Box<dyn FnMut() -> zcompute::Result<()>>,
    ) -> zcompute::Result<SimGraph> {
        let refuse = || ComputeError::Unsupported {
            op: "capture",
            reason: "refused by the test".into(),
        };
        match self.fail_capture.get() {
            Some(false) => return Err(refuse()),
            Some(true) => {
                body()?;
                return Err(refuse());
            }
            None => {}
        }
        body()?;
        self.captures.set(self.captures.get() + 1);
        Ok(SimGraph { body })
    }

    fn replay(&self, graph: &mut SimGraph) -> zcompute::Result<()> {
        (graph.body)()
    }
}

/// Shared handle so a test can look at the log while the trainer owns the backend.
pub type Shared<T> = Rc<SimBackend<T>>;
