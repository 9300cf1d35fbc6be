//! Captured graphs and their executables.
//!
//! A graph is the list of operations capture recorded, nothing else: launching an executable
//! queues exactly those operations on the stream. Memory-allocation nodes keep the address they
//! were given at capture; that memory belongs to the graph (and its executables) until the last
//! of them is destroyed, and counts against capacity until then.
//!
//! Relaunch rule (docs/capture-rules.md, "Memory nodes"): a graph with an allocation node and no
//! matching free node launches once; the second `cuGraphLaunch` of the same executable returns
//! 1 unless it was instantiated with auto-free-on-launch, or the memory was freed in between.

use std::collections::HashMap;
use std::sync::Arc;

use super::capture::{Ask, Capture};
use super::memory::AllocKind;
use super::ops::Op;
use super::state::{Cx, State};
use crate::driver::{CuCode, DriverResult};
use crate::types::{DevicePtr, Graph, GraphExec, InstantiateFlags, Stream};

#[derive(Debug)]
pub(crate) struct GraphData {
    pub nodes: Arc<[Op]>,
    /// Offsets of the memory-node allocations this graph holds a reference to.
    pub mem: Vec<u64>,
    /// Some allocation node has no matching free node.
    pub unfreed: bool,
}

#[derive(Debug)]
pub(crate) struct ExecData {
    pub nodes: Arc<[Op]>,
    pub mem: Vec<u64>,
    pub unfreed: bool,
    pub auto_free: bool,
    /// Instantiated to run each kernel at the priority it was captured with.
    pub use_node_priority: bool,
    /// Launched, and its unfreed memory has not been freed since.
    pub outstanding: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Graphs {
    pub graphs: HashMap<u64, GraphData>,
    pub execs: HashMap<u64, ExecData>,
    /// References to each memory-node allocation (graph plus executables).
    pub mem_refs: HashMap<u64, u32>,
}

impl State {
    pub(crate) fn graph_from_capture(&mut self, c: Capture) -> Graph {
        let mut mem = Vec::new();
        for p in &c.allocs {
            if let Some((base, _)) = self.mem.find_base(*p) {
                *self.graphs.mem_refs.entry(base).or_insert(0) += 1;
                mem.push(base);
            }
        }
        let unfreed = c.allocs.iter().any(|p| !c.freed.contains(p));
        let id = self.handle();
        self.graphs.graphs.insert(
            id,
            GraphData {
                nodes: c.nodes.into(),
                mem,
                unfreed,
            },
        );
        Graph(id)
    }

    fn drop_mem_refs(&mut self, mem: &[u64]) {
        for base in mem {
            if let Some(n) = self.graphs.mem_refs.get_mut(base) {
                *n -= 1;
                if *n == 0 {
                    self.graphs.mem_refs.remove(base);
                    self.mem.release(*base);
                }
            }
        }
    }

    pub(crate) fn graph_node_count(&mut self, cx: &mut Cx, g: Graph) -> DriverResult<usize> {
        self.gate(cx, Ask::none())?;
        let data = self
            .graphs
            .graphs
            .get(&g.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?;
        Ok(data.nodes.len())
    }

    pub(crate) fn graph_destroy(&mut self, cx: &mut Cx, g: Graph) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        let data = self
            .graphs
            .graphs
            .remove(&g.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?;
        self.drop_mem_refs(&data.mem);
        Ok(())
    }

    pub(crate) fn graph_instantiate(
        &mut self,
        cx: &mut Cx,
        g: Graph,
        flags: InstantiateFlags,
    ) -> DriverResult<GraphExec> {
        self.gate(cx, Ask::none())?;
        let data = self
            .graphs
            .graphs
            .get(&g.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?;
        let exec = ExecData {
            nodes: data.nodes.clone(),
            mem: data.mem.clone(),
            unfreed: data.unfreed,
            auto_free: flags.auto_free_on_launch,
            use_node_priority: flags.use_node_priority,
            outstanding: false,
        };
        for base in &exec.mem {
            *self.graphs.mem_refs.entry(*base).or_insert(0) += 1;
        }
        let id = self.handle();
        self.graphs.execs.insert(id, exec);
        Ok(GraphExec(id))
    }

    pub(crate) fn graph_launch(
        &mut self,
        cx: &mut Cx,
        e: GraphExec,
        s: Stream,
    ) -> DriverResult<()> {
        self.gate(cx, Ask::on(s))?;
        self.stream_exists(cx, s)?;
        let exec = self
            .graphs
            .execs
            .get(&e.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?;
        if exec.unfreed && exec.outstanding && !exec.auto_free {
            return Err(cx.cuda(CuCode::INVALID_VALUE));
        }
        let nodes = exec.nodes.clone();
        for op in nodes.iter() {
            let seq = self.enqueue(cx, s, op.clone())?;
            if let Op::EventRecord { event } = op {
                self.mark_recorded(*event, s, seq);
            }
        }
        if let Some(exec) = self.graphs.execs.get_mut(&e.0) {
            exec.outstanding = exec.unfreed;
        }
        Ok(())
    }

    pub(crate) fn graph_exec_destroy(&mut self, cx: &mut Cx, e: GraphExec) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        let exec = self
            .graphs
            .execs
            .remove(&e.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?;
        self.drop_mem_refs(&exec.mem);
        Ok(())
    }

    /// Frees device memory now: an ordinary allocation is released; a graph's memory stays with
    /// the graph, but its executables may launch again (the user freed what the last launch
    /// allocated).
    pub(crate) fn release_device(&mut self, ptr: DevicePtr) {
        let Some((base, a)) = self.mem.find_base(ptr) else {
            return;
        };
        if a.kind == AllocKind::Graph {
            if let Some(a) = self.mem.alloc_mut(base) {
                a.free_pending = false;
            }
            for exec in self
                .graphs
                .execs
                .values_mut()
                .filter(|x| x.mem.contains(&base))
            {
                exec.outstanding = false;
            }
            return;
        }
        self.mem.release(base);
    }
}
