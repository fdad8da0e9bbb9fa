//! Tensor parallelism over MLX's distributed runtime: a group of processes, one per device, that
//! run the same model on their shard of each matrix and sum partial results with MLX's
//! collectives. The transport is MLX's own backend: `ring` (TCP; CPU and Metal) or `nccl` (CUDA).
//! Each rank finds the others from the environment MLX's launcher (`mlx.launch`) sets: MLX_RANK
//! and MLX_HOSTFILE for ring; MLX_RANK, MLX_WORLD_SIZE, NCCL_HOST_IP and NCCL_PORT for nccl.

use super::error::{Error, Result};
use mlx_rs::{Array, Stream};
use std::ffi::CString;
use std::ops::Range;
use std::sync::Arc;

/// An MLX distributed backend sala starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// TCP between ranks; collectives run on the CPU (the only backend MLX has on Macs and CPUs).
    Ring,
    /// NVIDIA's collectives on the GPU stream.
    Nccl,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::Nccl => "nccl",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "ring" => Some(Backend::Ring),
            "nccl" => Some(Backend::Nccl),
            _ => None,
        }
    }

    /// The stream a collective runs on: MLX's ring works on CPU buffers, NCCL on the GPU's.
    fn stream(self) -> Stream {
        match self {
            Backend::Ring => Stream::cpu(),
            Backend::Nccl => Stream::gpu(),
        }
    }
}

/// Whether this MLX build has `backend` (the CPU wheel's NCCL is a stub).
pub fn is_available(backend: Backend) -> bool {
    install_error_handler();
    let name = CString::new(backend.name()).expect("no NUL in a backend name");
    // SAFETY: a NUL-terminated name.
    unsafe { mlx_sys::mlx_distributed_is_available(name.as_ptr()) }
}

/// mlx-rs installs its error handler on its first operation; before that, mlx-c's default
/// handler prints and exits the process on any error, so one guarded operation goes first.
fn install_error_handler() {
    let _ = Array::from_int(0).eval();
}

/// MLX's communicator for a group of ranks.
struct Group {
    raw: mlx_sys::mlx_distributed_group,
}

// SAFETY: a reference-counted handle to MLX's communicator, which MLX uses from whichever thread
// issues a collective; sala issues them from the one thread that runs the model.
unsafe impl Send for Group {}
unsafe impl Sync for Group {}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: `raw` came from mlx_distributed_init and is freed once.
        unsafe {
            mlx_sys::mlx_distributed_group_free(self.raw);
        }
    }
}

type Collective = unsafe extern "C" fn(*mut mlx_sys::mlx_array, mlx_sys::mlx_array, mlx_sys::mlx_distributed_group, mlx_sys::mlx_stream) -> i32;

/// A rank's key-value heads ([`TensorParallel::kv_heads`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvHeads {
    /// The heads it holds, of all the model's.
    pub range: Range<usize>,
    /// Ranks holding each of them: 1 when they are split, more when replicated.
    pub replicas: usize,
    /// The model's KV heads.
    pub total: usize,
}

impl KvHeads {
    /// Whether other ranks hold the same heads (their query heads then form one group between them).
    pub fn replicated(&self) -> bool {
        self.replicas > 1
    }
}

/// A faster sum over the ranks than the backend's own collective, for the arrays it takes (on
/// CUDA, through the peers' memory: `kernels::all_reduce`). Every rank must have the same one,
/// so that each sum takes the same path everywhere.
pub trait FastSum: Send + Sync {
    /// The element-wise sum of every rank's `x`, or `None` where this path does not take `x`
    /// (its size or type): the decision depends on `x`'s shape and type alone.
    fn all_sum(&self, x: &Array) -> Option<mlx_rs::error::Result<Array>>;
    /// What users see it called ("peer memory").
    fn name(&self) -> &'static str;
}

/// This process's place in a tensor-parallel group: which shard of every split matrix it holds
/// and how it sums partial results with the other ranks. A single device is a group of one, for
/// which every collective returns its input.
#[derive(Clone)]
pub struct TensorParallel {
    pub rank: usize,
    pub size: usize,
    group: Option<(Arc<Group>, Backend)>,
    fast_sum: Option<Arc<dyn FastSum>>,
}

impl Default for TensorParallel {
    fn default() -> Self {
        Self::single()
    }
}

impl std::fmt::Debug for TensorParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} of {}", self.rank, self.size)
    }
}

impl TensorParallel {
    /// One device: nothing split, nothing summed.
    pub fn single() -> Self {
        Self { rank: 0, size: 1, group: None, fast_sum: None }
    }

    /// Joins the group of `size` ranks that `backend` finds through the environment. Refused when
    /// the backend is missing, cannot reach the other ranks, or the group has another size.
    pub fn join(backend: Backend, size: usize) -> Result<Self> {
        if !is_available(backend) {
            return Err(Error::Usage(format!(
                "this MLX build has no `{}` distributed backend{}",
                backend.name(),
                match backend {
                    Backend::Nccl => " (NCCL comes with the CUDA build of MLX; on CPUs and Macs use ring)",
                    Backend::Ring => "",
                }
            )));
        }
        let name = CString::new(backend.name()).expect("no NUL in a backend name");
        // SAFETY: `raw` is written by MLX on success and freed on failure; strict: fail rather
        // than fall back to a group of one.
        let group = unsafe {
            let mut raw = mlx_sys::mlx_distributed_group_new();
            if mlx_sys::mlx_distributed_init(&mut raw, true, name.as_ptr()) != 0 || raw.ctx.is_null() {
                mlx_sys::mlx_distributed_group_free(raw);
                return Err(Error::Usage(format!(
                    "MLX could not start its `{}` backend: check the environment its launcher sets (MLX_RANK, and \
                     MLX_HOSTFILE for ring; MLX_WORLD_SIZE, NCCL_HOST_IP and NCCL_PORT for nccl) and that every rank started",
                    backend.name()
                )));
            }
            Group { raw }
        };
        if backend == Backend::Ring {
            super::encoder::keep_on_calling_thread();
        }
        // SAFETY: a live group.
        let (rank, found) = unsafe {
            (mlx_sys::mlx_distributed_group_rank(group.raw) as usize, mlx_sys::mlx_distributed_group_size(group.raw) as usize)
        };
        if found != size {
            return Err(Error::Usage(format!(
                "--tp {size}, but the `{}` backend's group has {found} ranks: the launcher's hosts must list one entry per rank",
                backend.name()
            )));
        }
        Ok(Self { rank, size, group: Some((Arc::new(group), backend)), fast_sum: None })
    }

    pub fn is_single(&self) -> bool {
        self.size == 1
    }

    /// The rank that speaks for the group: it prints, writes files and answers requests.
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }

    /// The backend the group runs on (`None` for a single device).
    pub fn backend(&self) -> Option<Backend> {
        self.group.as_ref().map(|(_, b)| *b)
    }

    /// This rank's equal share of `n` things (heads, rows, columns): refused, naming `what`,
    /// when the ranks cannot share them equally.
    ///
    /// Key-value heads go through [`TensorParallel::kv_heads`], which also replicates them.
    pub fn part(&self, n: usize, what: &str) -> Result<Range<usize>> {
        if !n.is_multiple_of(self.size) {
            return Err(Error::Usage(format!(
                "tensor parallelism over {} ranks splits {what} between them, and {n} is not divisible by {}: \
                 choose a --tp that divides {n}",
                self.size, self.size
            )));
        }
        let share = n / self.size;
        Ok(self.rank * share..(self.rank + 1) * share)
    }

    /// This rank's key-value heads of `kv_heads`, which `heads` query heads share in equal groups:
    /// its equal share, or, when the ranks outnumber them, the one head its query heads read
    /// (each KV head then held whole by `size / kv_heads` ranks, as vLLM does). Refused, naming
    /// `what`, when neither count divides the other.
    pub fn kv_heads(&self, kv_heads: usize, heads: usize, what: &str) -> Result<KvHeads> {
        if kv_heads.is_multiple_of(self.size) {
            return Ok(KvHeads { range: self.part(kv_heads, what)?, replicas: 1, total: kv_heads });
        }
        if kv_heads == 0 || !self.size.is_multiple_of(kv_heads) {
            return Err(Error::Usage(format!(
                "tensor parallelism over {} ranks shares {what} equally between them, or gives each rank one of them \
                 whole where the ranks outnumber them, and {kv_heads} heads over {} ranks allow neither: \
                 choose a --tp that divides {kv_heads} or is a multiple of it",
                self.size, self.size
            )));
        }
        let replicas = self.size / kv_heads;
        // Each rank's query heads (an equal share) then lie in one group: its KV head's.
        self.part(heads, "the query heads")?;
        let head = self.rank / replicas;
        Ok(KvHeads { range: head..head + 1, replicas, total: kv_heads })
    }

    /// The group with `fast` taking the sums it can (every rank must attach the same).
    pub fn with_fast_sum(&self, fast: Arc<dyn FastSum>) -> Self {
        Self { fast_sum: Some(fast), ..self.clone() }
    }

    /// The group summing through its backend's own collective only.
    pub fn without_fast_sum(&self) -> Self {
        Self { fast_sum: None, ..self.clone() }
    }

    /// The name of the faster sum attached, if any.
    pub fn fast_sum_name(&self) -> Option<&'static str> {
        self.fast_sum.as_ref().map(|f| f.name())
    }

    /// The element-wise sum of every rank's `x`.
    pub fn all_sum(&self, x: &Array) -> Result<Array> {
        if let Some(sum) = self.fast_sum.as_ref().and_then(|f| f.all_sum(x)) {
            return Ok(sum?);
        }
        self.collective(x, mlx_sys::mlx_distributed_all_sum)
    }

    /// The element-wise maximum of every rank's `x`.
    pub fn all_max(&self, x: &Array) -> Result<Array> {
        self.collective(x, mlx_sys::mlx_distributed_all_max)
    }

    /// Every rank's `x` joined along the first axis, in rank order.
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        self.collective(x, mlx_sys::mlx_distributed_all_gather)
    }

    /// Rank 0's `values` on every rank (the others' are ignored; all must pass the same length).
    pub fn broadcast(&self, values: &[i32]) -> Result<Vec<i32>> {
        if self.is_single() {
            return Ok(values.to_vec());
        }
        let mine: Vec<i32> = if self.is_leader() { values.to_vec() } else { vec![0; values.len()] };
        let sum = self.all_sum(&Array::from_slice(&mine, &[mine.len() as i32]))?;
        sum.eval()?;
        Ok(sum.as_slice::<i32>().to_vec())
    }

    /// What `leader` computes on rank 0, on every rank (the others never call it). If it fails,
    /// rank 0 ends with the error and its supervisor stops the others.
    pub fn share<E: From<Error>>(&self, leader: impl FnOnce() -> Result<Vec<i32>, E>) -> Result<Vec<i32>, E> {
        if self.is_single() {
            return leader();
        }
        let values = if self.is_leader() { leader()? } else { Vec::new() };
        let len = self.broadcast(&[values.len() as i32])?[0] as usize;
        if len == 0 {
            return Ok(Vec::new());
        }
        let mine = if self.is_leader() { values } else { vec![0; len] };
        Ok(self.broadcast(&mine)?)
    }

    /// [`TensorParallel::share`] of one 64-bit number (a seed, a budget).
    pub fn share_u64<E: From<Error>>(&self, leader: impl FnOnce() -> Result<u64, E>) -> Result<u64, E> {
        let words = self.share::<E>(|| {
            let value = leader()?;
            Ok(vec![(value >> 32) as u32 as i32, value as u32 as i32])
        })?;
        Ok((words[0] as u32 as u64) << 32 | words[1] as u32 as u64)
    }

    /// [`TensorParallel::share`] of bytes (four to a word).
    pub fn share_bytes<E: From<Error>>(&self, leader: impl FnOnce() -> Result<Vec<u8>, E>) -> Result<Vec<u8>, E> {
        if self.is_single() {
            return leader();
        }
        let words = self.share::<E>(|| {
            let bytes = leader()?;
            if bytes.is_empty() {
                return Ok(Vec::new()); // One collective: the length alone.
            }
            let mut words = vec![bytes.len() as i32];
            words.extend(bytes.chunks(4).map(|c| {
                let mut word = [0u8; 4];
                word[..c.len()].copy_from_slice(c);
                i32::from_le_bytes(word)
            }));
            Ok(words)
        })?;
        let Some((&len, data)) = words.split_first() else { return Ok(Vec::new()) };
        Ok(data.iter().flat_map(|w| w.to_le_bytes()).take(len as usize).collect())
    }

    /// Refuses unless every rank passes the same `values` (what each loaded, how it was started),
    /// naming `what` differs.
    pub fn check_agree(&self, values: &[i64], what: &str) -> Result<()> {
        if self.is_single() {
            return Ok(());
        }
        let x = Array::from_slice(values, &[values.len() as i32]);
        let (max, min) = (self.all_max(&x)?, self.all_max(&x.negative()?)?);
        mlx_rs::transforms::eval([&max, &min])?;
        let same = max.as_slice::<i64>().iter().zip(min.as_slice::<i64>()).all(|(a, b)| *a == -*b);
        if !same {
            return Err(Error::Usage(format!("the tensor-parallel ranks disagree on {what}: every rank must be started alike")));
        }
        Ok(())
    }

    fn collective(&self, x: &Array, op: Collective) -> Result<Array> {
        let Some((group, backend)) = &self.group else { return Ok(x.clone()) };
        let stream = backend.stream();
        // SAFETY: `out` is a fresh array that MLX fills on success and the returned Array owns.
        unsafe {
            let mut out = mlx_sys::mlx_array_new();
            if op(&mut out, x.as_ptr(), group.raw, stream.as_ptr()) != 0 {
                mlx_sys::mlx_array_free(out);
                return Err(Error::Usage(format!(
                    "an MLX `{}` collective on {:?} {:?} was refused",
                    backend.name(),
                    x.dtype(),
                    x.shape()
                )));
            }
            Ok(Array::from_ptr(out))
        }
    }
}
