//! The tape: ops append nodes in execution order (so reverse order is a topological order) and
//! backward walks them once from the root down.
//!
//! Memory policy (failure class C of ARCHITECTURE.md): while a tape records, the outputs of ops
//! that need a gradient are allocated in zmem's `Saved` class, and an input an op saves that lives
//! in `Scratch` (an uploaded batch, a no-grad result) is copied into `Saved` first. So every tensor
//! a node keeps for backward owns memory that no step reset reclaims; the node drops it as soon as
//! its backward ran, or when the tape is dropped. Backward's temporaries are `Scratch`.
//! `Tape::unprotected` turns the policy off (saved tensors stay in `Scratch`): it exists only as
//! the negative control of scenario C, with the `testing` feature.

use crate::error::{GradError, Result};
use crate::leaf_grads::{LeafGrad, accumulate_leaf, accumulate_leaves};
use crate::memory::ClassGuard;
use crate::var::{Origin, Var, Version, new_version};
use crate::weight_shadow::WeightShadow;
use smallvec::{SmallVec, smallvec};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use zcompute::{AllocClass, BBf16, BTensor, Element, MathMode, prelude::*};

static NEXT_TAPE_ID: AtomicU64 = AtomicU64::new(1);

/// A tensor a node keeps for its backward, with the version of the data when it was saved.
pub(crate) struct Saved<B: Ops<T>, T: Element> {
    tensor: BTensor<B, T>,
    version: Version,
    at: u64,
    name: &'static str,
}

impl<B: Ops<T>, T: Element> Saved<B, T> {
    /// The saved tensor, refused if it was written in place since it was saved.
    pub(crate) fn get(&self, op: &'static str) -> Result<&BTensor<B, T>> {
        unchanged(op, self.name, &self.version, self.at)?;
        Ok(&self.tensor)
    }
}

/// A tensor's bf16 copy a node keeps for its backward in place of the tensor (under bf16 the
/// backward reads it only as a bf16 product's operand), with the tensor's version when the
/// copy was made.
pub(crate) struct SavedBf16<B: Ops<T>, T: Element> {
    copy: BBf16<B, T>,
    version: Version,
    at: u64,
    name: &'static str,
}

impl<B: Ops<T>, T: Element> SavedBf16<B, T> {
    /// The copy, refused if the tensor was written in place since (as [`Saved::get`]: the
    /// copy itself would still hold the old values, but the product converting per call would
    /// have been refused).
    pub(crate) fn get(&self, op: &'static str) -> Result<&BBf16<B, T>> {
        unchanged(op, self.name, &self.version, self.at)?;
        Ok(&self.copy)
    }
}

/// Refuses a saved value whose tensor was written in place since version `at`.
fn unchanged(op: &'static str, saved: &'static str, version: &Version, at: u64) -> Result<()> {
    let now = version.get();
    if now != at {
        return Err(GradError::ModifiedInPlace {
            op,
            saved,
            then: at,
            now,
        });
    }
    Ok(())
}

/// Gradients per output slot of a node (`None`: no gradient reached that output).
pub(crate) type SlotGrads<B, T> = SmallVec<[Option<BTensor<B, T>>; 1]>;

/// The backward of one recorded op.
pub(crate) trait BackwardOp<B: Ops<T>, T: Element> {
    /// Op name for errors and logs.
    fn name(&self) -> &'static str;

    /// Gradients of the op's inputs (in input order; `None` for inputs that need none) from
    /// the gradients of its outputs. At least one of `grads` is `Some`.
    fn backward(
        &self,
        b: &B,
        grads: &[Option<BTensor<B, T>>],
    ) -> Result<Vec<Option<BTensor<B, T>>>>;

    /// As [`BackwardOp::backward`], where `into[i]` is `Some(buf)` when input `i` is a
    /// parameter whose gradient buffer is dense: the op may add that input's gradient straight
    /// into `buf` (always `+=`, so a parameter used twice stays right) and return `None` for it.
    /// The provided body adds nothing itself and leaves the accumulation to the tape.
    fn backward_into(
        &self,
        b: &B,
        grads: &[Option<BTensor<B, T>>],
        into: &[Option<&BTensor<B, T>>],
    ) -> Result<Vec<Option<BTensor<B, T>>>> {
        let _ = into;
        self.backward(b, grads)
    }
}

/// Where an input's gradient goes.
enum Edge<B: Ops<T>, T: Element> {
    Skip,
    Node { id: usize, slot: usize },
    Leaf(BTensor<B, T>),
}

struct Node<'b, B: Ops<T>, T: Element> {
    op: Box<dyn BackwardOp<B, T> + 'b>,
    inputs: SmallVec<[Edge<B, T>; 3]>,
}

struct NodeInfo {
    name: &'static str,
    outputs: usize,
}

/// Records ops for backward (or, in no-grad mode, only runs them).
pub struct Tape<'b, B: Ops<T>, T: Element> {
    backend: &'b B,
    id: u64,
    recording: bool,
    saved_class: AllocClass,
    /// The arithmetic of the matrix products recorded (`linear`, `linear_add`, `matmul`, and
    /// their backward): the precision policy's (docs/precision.md); float32 unless set.
    math_mode: MathMode,
    /// Under bf16, the step's bf16 copy of the weights (`crate::weight_shadow`): the Linear
    /// products take a parameter's weight from it instead of converting it per call.
    weight_shadow: Option<WeightShadow<B, T>>,
    nodes: RefCell<Vec<Option<Node<'b, B, T>>>>,
    info: RefCell<Vec<NodeInfo>>,
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for Tape<'_, B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tape")
            .field("id", &self.id)
            .field("recording", &self.recording)
            .field("saved_class", &self.saved_class)
            .field("math_mode", &self.math_mode)
            .field("nodes", &self.info.borrow().len())
            .field("pending", &self.pending_nodes())
            .finish()
    }
}

impl<'b, B: Ops<T>, T: Element> Tape<'b, B, T> {
    fn with(backend: &'b B, recording: bool, saved_class: AllocClass) -> Self {
        Tape {
            backend,
            id: NEXT_TAPE_ID.fetch_add(1, Ordering::Relaxed),
            recording,
            saved_class,
            math_mode: MathMode::F32,
            weight_shadow: None,
            nodes: RefCell::new(Vec::new()),
            info: RefCell::new(Vec::new()),
        }
    }

    /// A recording tape: saved tensors live in the `Saved` class.
    #[must_use]
    pub fn new(backend: &'b B) -> Self {
        Self::with(backend, true, AllocClass::Saved)
    }

    /// This tape with its matrix products (Linear layers forward and backward, `matmul`, the
    /// products inside attention's fused core) run under `mode` (`zcompute::PrecisionOps`,
    /// `zcompute::AttentionOps::qk_norm_attention_mode`; `Precision::math_mode` maps a policy
    /// to it).
    /// Everything else stays float32. Under [`MathMode::F32`] the products are the backend's
    /// float32 ones, bit for bit as without this call. A backend that cannot run `mode`
    /// refuses the first product with a typed error.
    #[must_use]
    pub fn with_math_mode(mut self, mode: MathMode) -> Self {
        self.math_mode = mode;
        self
    }

    /// This tape with the Linear products' weights read from `shadow` under bf16 (the
    /// trainer's, refreshed at the start of the step): bit for bit the per-call conversion.
    #[must_use]
    pub(crate) fn with_weight_shadow(mut self, shadow: Option<WeightShadow<B, T>>) -> Self {
        self.weight_shadow = shadow;
        self
    }

    /// `w`'s bf16 copy from the tape's shadow, when the products run under bf16 and `w` is a
    /// parameter of the shadowed buffer.
    pub(crate) fn bf16_weight(&self, w: &Var<B, T>) -> Option<BBf16<B, T>> {
        if self.math_mode != MathMode::Bf16 {
            return None;
        }
        self.weight_shadow.as_ref()?.of(w.value())
    }

    /// Whether the Linear layers convert each activation and gradient to bf16 once (the
    /// input's copy kept for the weight's gradient, the output's gradient converted once for
    /// both backward products: `crate::ops::linear`) rather than on every product call: a
    /// recording tape under bf16 with the step's weight copy (the trainer's tapes). Without
    /// the copy (a tape of your own, the trainer's per-call reference) every operand converts
    /// per call; the bits are the same either way.
    pub(crate) fn bf16_operands_once(&self) -> bool {
        self.recording && self.math_mode == MathMode::Bf16 && self.weight_shadow.is_some()
    }

    /// The arithmetic of this tape's matrix products ([`Tape::with_math_mode`]).
    #[must_use]
    pub fn math_mode(&self) -> MathMode {
        self.math_mode
    }

    /// A tape that records nothing: ops only run (validation, inference). Outputs are allocated
    /// in whatever class the backend is set to (scratch inside a step).
    #[must_use]
    pub fn no_grad(backend: &'b B) -> Self {
        Self::with(backend, false, AllocClass::Scratch)
    }

    /// NEGATIVE CONTROL ONLY (scenario C): a recording tape that leaves saved tensors in the
    /// `Scratch` class, as the engine this project replaces did. A step reset between forward and
    /// backward on a device backend may then hand their memory out again. Only with the
    /// `testing` feature (tests enable it; a release build of `ztrain` has no such switch).
    #[cfg(any(test, feature = "testing"))]
    #[must_use]
    pub fn unprotected(backend: &'b B) -> Self {
        Self::unprotected_in_crate(backend)
    }

    /// The unprotected tape for the trainer's own negative control (reachable only through
    /// `TrainerConfig::unprotected_saved_tensors`, itself behind the `testing` feature).
    pub(crate) fn unprotected_in_crate(backend: &'b B) -> Self {
        Self::with(backend, true, AllocClass::Scratch)
    }

    #[must_use]
    pub fn backend(&self) -> &'b B {
        self.backend
    }

    #[must_use]
    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// The class saved tensors are allocated in (`Saved`, or `Scratch` for `unprotected`).
    #[must_use]
    pub fn saved_class(&self) -> AllocClass {
        self.saved_class
    }

    /// Nodes still holding their saved tensors (recorded, not yet consumed by backward).
    #[must_use]
    pub fn pending_nodes(&self) -> usize {
        self.nodes.borrow().iter().filter(|n| n.is_some()).count()
    }

    /// Whether an op on `inputs` must be recorded; refuses variables of another tape.
    pub(crate) fn tracks(&self, op: &'static str, inputs: &[&Var<B, T>]) -> Result<bool> {
        let mut any = false;
        for v in inputs {
            match v.origin {
                Origin::Constant => {}
                Origin::Leaf(_) => any = true,
                Origin::Node { tape, .. } if tape == self.id => any = true,
                Origin::Node { tape, .. } => {
                    return Err(GradError::ForeignVar {
                        op,
                        var_tape: tape,
                        tape: self.id,
                    });
                }
            }
        }
        Ok(any && self.recording)
    }

    /// Runs a forward kernel; a tracked output goes to the saved class (a later op may keep it).
    pub(crate) fn run<F>(&self, tracked: bool, f: F) -> Result<BTensor<B, T>>
    where
        F: FnOnce(&B) -> zcompute::Result<BTensor<B, T>>,
    {
        let _class = tracked.then(|| ClassGuard::new(self.backend, self.saved_class));
        Ok(f(self.backend)?)
    }

    /// Saves an input for backward: owned by the node, in the saved class (a scratch input is
    /// copied there first, so no step reset can reclaim what backward will read).
    pub(crate) fn save(&self, v: &Var<B, T>, name: &'static str) -> Result<Saved<B, T>> {
        let scratch = self.backend.storage_class(&v.value) == Some(AllocClass::Scratch);
        let tensor = if scratch && self.saved_class == AllocClass::Saved {
            let _class = ClassGuard::new(self.backend, AllocClass::Saved);
            self.backend.contiguous(&v.value)?
        } else {
            v.value.clone()
        };
        Ok(Saved {
            tensor,
            version: v.version.clone(),
            at: v.version.get(),
            name,
        })
    }

    /// Saves `v`'s bf16 copy for backward in place of `v` (`Tape::bf16_operands_once`): made
    /// in the saved class, so no step reset reclaims it; `v` itself is not kept.
    pub(crate) fn save_bf16(&self, v: &Var<B, T>, name: &'static str) -> Result<SavedBf16<B, T>> {
        let copy = {
            let _class = ClassGuard::new(self.backend, self.saved_class);
            self.backend.bf16_copy_of(&v.value)?
        };
        Ok(SavedBf16 {
            copy,
            version: v.version.clone(),
            at: v.version.get(),
            name,
        })
    }

    /// Saves an output (already allocated in the saved class by `run`).
    pub(crate) fn save_output(
        &self,
        t: &BTensor<B, T>,
        version: &Version,
        name: &'static str,
    ) -> Saved<B, T> {
        Saved {
            tensor: t.clone(),
            version: version.clone(),
            at: version.get(),
            name,
        }
    }

    /// A fresh version counter for an op output.
    pub(crate) fn new_version(&self) -> Version {
        new_version()
    }

    /// Records a node with several outputs; each output gets its version counter.
    pub(crate) fn push(
        &self,
        op: Box<dyn BackwardOp<B, T> + 'b>,
        inputs: &[&Var<B, T>],
        outputs: Vec<(BTensor<B, T>, Version)>,
    ) -> Vec<Var<B, T>> {
        let edges = inputs
            .iter()
            .map(|v| match &v.origin {
                Origin::Constant => Edge::Skip,
                Origin::Leaf(g) => Edge::Leaf(g.clone()),
                Origin::Node { id, slot, .. } => Edge::Node {
                    id: *id,
                    slot: *slot,
                },
            })
            .collect();
        let mut nodes = self.nodes.borrow_mut();
        let id = nodes.len();
        self.info.borrow_mut().push(NodeInfo {
            name: op.name(),
            outputs: outputs.len(),
        });
        nodes.push(Some(Node { op, inputs: edges }));
        outputs
            .into_iter()
            .enumerate()
            .map(|(slot, (value, version))| Var {
                value,
                origin: Origin::Node {
                    tape: self.id,
                    id,
                    slot,
                },
                version,
            })
            .collect()
    }

    /// Records a single-output node.
    pub(crate) fn push1(
        &self,
        op: Box<dyn BackwardOp<B, T> + 'b>,
        inputs: &[&Var<B, T>],
        out: BTensor<B, T>,
        version: Version,
    ) -> Var<B, T> {
        let mut v = self.push(op, inputs, vec![(out, version)]);
        // `push` returns exactly one variable per output given.
        v.swap_remove(0)
    }

    /// The result of an untracked op: a constant.
    pub(crate) fn constant(&self, out: BTensor<B, T>) -> Var<B, T> {
        Var::constant(out)
    }

    /// Backward from a root with a seed of ones (a scalar loss: d loss / d loss = 1).
    pub fn backward(&self, root: &Var<B, T>) -> Result<()> {
        let seed = {
            let _class = ClassGuard::new(self.backend, AllocClass::Scratch);
            self.backend.full(root.shape(), T::ONE)?
        };
        self.backward_with(root, seed)
    }

    /// Backward from `root` with the given gradient of the root. Gradients of parameters are
    /// added into their persistent buffers; every node on the way drops its saved tensors as
    /// soon as its backward ran.
    pub fn backward_with(&self, root: &Var<B, T>, seed: BTensor<B, T>) -> Result<()> {
        self.backward_hooked(root, seed, &mut |_| Ok(()))
    }

    /// As [`Tape::backward_with`], calling `on_final` with a parameter's gradient buffer as
    /// soon as its gradient is final: the work of the last node that adds to it is queued and
    /// no node left adds to it again (the data-parallel step starts that gradient's all-reduce
    /// then). Each buffer once; a buffer only nodes backward never reaches add to is handed
    /// over when the walk passes them.
    pub fn backward_hooked(
        &self,
        root: &Var<B, T>,
        seed: BTensor<B, T>,
        on_final: &mut dyn FnMut(&BTensor<B, T>) -> Result<()>,
    ) -> Result<()> {
        if seed.shape() != root.shape() {
            return Err(GradError::SeedShape {
                seed: seed.shape().to_vec(),
                root: root.shape().to_vec(),
            });
        }
        let _class = ClassGuard::new(self.backend, AllocClass::Scratch);
        let (root_id, root_slot) = match &root.origin {
            Origin::Node { tape, id, slot } if *tape == self.id => (*id, *slot),
            Origin::Node { tape, .. } => {
                return Err(GradError::ForeignVar {
                    op: "backward",
                    var_tape: *tape,
                    tape: self.id,
                });
            }
            Origin::Leaf(g) => {
                accumulate_leaf(self.backend, g, &seed)?;
                return on_final(g);
            }
            Origin::Constant => return Err(GradError::RootNotRecorded),
        };
        let mut grads: Vec<Option<SlotGrads<B, T>>> = Vec::new();
        grads.resize_with(root_id + 1, || None);
        let outputs = self.info.borrow()[root_id].outputs;
        let mut root_grads: SlotGrads<B, T> = smallvec![None; outputs];
        root_grads[root_slot] = Some(seed);
        grads[root_id] = Some(root_grads);

        // Each leaf buffer with the lowest node that adds to it (backward runs that one last),
        // in the order backward reaches them.
        let last_uses = self.last_uses(root_id);
        let mut finished = 0;
        for id in (0..=root_id).rev() {
            while let Some((_, buf)) = last_uses.get(finished).filter(|(at, _)| *at > id) {
                on_final(buf)?;
                finished += 1;
            }
            let Some(out_grads) = grads[id].take() else {
                continue;
            };
            let name = self.info.borrow()[id].name;
            let node = self.nodes.borrow_mut()[id]
                .take()
                .ok_or(GradError::BackwardTwice { op: name })?;
            tracing::trace!(target: "zgrad.tape.backward", op = name, id, "node");
            let into: SmallVec<[Option<&BTensor<B, T>>; 3]> = node
                .inputs
                .iter()
                .map(|edge| match edge {
                    Edge::Leaf(buf) if buf.is_contiguous() => Some(buf),
                    _ => None,
                })
                .collect();
            let input_grads = node.op.backward_into(self.backend, &out_grads, &into)?;
            drop(out_grads);
            let mut leaves: SmallVec<[LeafGrad<'_, B::Storage>; 4]> = SmallVec::new();
            for (edge, g) in node.inputs.iter().zip(input_grads) {
                let Some(g) = g else { continue };
                match edge {
                    Edge::Skip => {}
                    Edge::Leaf(buf) => leaves.push((buf, g)),
                    Edge::Node { id: src, slot } => {
                        let n = self.info.borrow()[*src].outputs;
                        let entry = grads[*src].get_or_insert_with(|| smallvec![None; n]);
                        entry[*slot] = Some(match entry[*slot].take() {
                            Some(prev) => self.backend.add(&prev, &g)?,
                            None => g,
                        });
                    }
                }
            }
            // Parameter gradients, adjacent ones by one add (`leaf_grads`).
            accumulate_leaves(self.backend, &leaves)?;
            drop(leaves);
            // `node` (and with it every tensor it saved) is dropped here.
        }
        for (_, buf) in &last_uses[finished..] {
            on_final(buf)?;
        }
        Ok(())
    }

    /// The leaf buffers of nodes `0..=root_id`, each with the lowest node that adds to it,
    /// highest node first (the order backward's walk finishes them).
    fn last_uses(&self, root_id: usize) -> Vec<(usize, BTensor<B, T>)> {
        let nodes = self.nodes.borrow();
        let mut uses: Vec<(usize, BTensor<B, T>)> = Vec::new();
        for (id, node) in nodes.iter().enumerate().take(root_id + 1) {
            let Some(node) = node else { continue };
            for edge in &node.inputs {
                let Edge::Leaf(buf) = edge else { continue };
                let seen = uses.iter().any(|(_, b)| {
                    b.shares_storage(buf)
                        && b.layout().offset() == buf.layout().offset()
                        && b.shape() == buf.shape()
                });
                if !seen {
                    uses.push((id, buf.clone()));
                }
            }
        }
        uses.sort_by_key(|u| std::cmp::Reverse(u.0));
        uses
    }
}
