//! Tensor parallelism's sums over the GPUs of one host through each other's memory
//! (`cuda/all_reduce.cu`): one kernel per sum, where a decoding token of MiniCPM-SALA-9B needs 88
//! sums and NCCL's all-reduce costs tens of µs each inside a graph (issue 61; README's
//! tensor-parallel figures, eval/results/2026-11-26-h200x2-tp). Each rank allocates
//! an exchange buffer with the CUDA driver, exports it (CUDA IPC), and maps every peer's; the
//! kernel pushes its part into the peers' buffers, raises a flag in each and sums what arrived.
//!
//! [`attach`] sets it up for an NCCL group and checks it against NCCL's own sum before any model
//! uses it; where a step fails on any rank, every rank keeps NCCL's collective, with a warning.
//! Sums past the largest slot (16 MiB a rank on two ranks, 1 MiB on more: [`regions`]) and of
//! other types than bf16, f16 and float32 still go through NCCL.
//! `SALA_PEER_SUM=off` keeps NCCL for every sum (for A/B measurements).

use super::custom::{apply, backend, Backend, KernelSource, Launch, TemplateArg};
use super::selfcheck::sample;
use crate::engine::distributed::{self, FastSum, TensorParallel};
use mlx_rs::{error::Exception, Array, Dtype};
use std::sync::{Arc, OnceLock};

const HEADER: &str = include_str!("../../cuda/all_reduce.cu");

static ALL_SUM: KernelSource = KernelSource {
    name: "sala_all_sum",
    inputs: &["x", "table", "after"],
    outputs: &["y", "ticket"],
    cuda_header: HEADER,
    cuda_body: "sala_all_sum<T, RANKS, RANK, REGION_AT, SLOT_BYTES, CHECKING>(x, reinterpret_cast<const unsigned long long*>(table), y, ticket, (size_t)x_shape[0]);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: 0,
};

/// A size class of sums: its region of the exchange buffer (at `at`: counts, flags, then two
/// slots a rank), the most bytes of a rank's part it takes (a slot), and its thread blocks: every
/// sum of a region has the same number, so that all of its blocks use the same slot.
#[derive(Clone, Copy)]
struct Region {
    at: usize,
    slot: usize,
    blocks: usize,
}

/// The regions of a group of `ranks`, smallest slot first: decoding batches (1 MiB: 128 tokens of
/// 4096 bf16 values) over a few blocks, and on two ranks a prompt chunk's activations (16 MiB:
/// 2048 tokens) over many; each rank sends its part to every other once, so more ranks keep to
/// the small sums, where NCCL's ring would send less.
fn regions(ranks: usize) -> Vec<Region> {
    let small = Region { at: 0, slot: 1 << 20, blocks: 16 };
    let mut regions = vec![small];
    if ranks == 2 {
        regions.push(Region { at: region_end(small, ranks), slot: 16 << 20, blocks: MAX_BLOCKS });
    }
    regions
}

/// The region of a group of `ranks` that takes a sum of `bytes` bytes of `dtype` a rank.
fn region_of(ranks: usize, dtype: Dtype, bytes: usize) -> Option<Region> {
    if !matches!(dtype, Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32) || bytes == 0 {
        return None;
    }
    regions(ranks).into_iter().find(|r| bytes <= r.slot)
}

fn region_end(region: Region, ranks: usize) -> usize {
    region.at + DATA_AT + 2 * ranks * region.slot
}

/// Where the data slots begin in a region, after the counts and flags (`SALA_AR_DATA_AT`).
const DATA_AT: usize = 8192;
/// The word of the buffer's first region that a wait of the check at start sets when it ran out
/// (`SALA_AR_TIMED_OUT`).
const TIMED_OUT: usize = 2047;
/// Thread blocks of one sum at most (`SALA_AR_MAX_BLOCKS`) and ranks (`SALA_AR_MAX_RANKS`).
const MAX_BLOCKS: usize = 128;
const MAX_RANKS: usize = 8;
// The header holds the counts, the flags and the check's word apart from the data.
const _: () = assert!(TIMED_OUT >= MAX_BLOCKS * (1 + MAX_RANKS) && TIMED_OUT < DATA_AT / 4);
const THREADS: usize = 512;

/// The sums of a group whose ranks have mapped each other's exchange buffers.
pub struct PeerSum {
    rank: usize,
    /// Every rank's exchange buffer as this process addresses it, in rank order.
    buffers: Vec<u64>,
}

impl PeerSum {
    fn ranks(&self) -> usize {
        self.buffers.len()
    }

    /// The region that takes `x`: a 16-bit or float32 array of at most its slot, on CUDA.
    fn region_for(&self, x: &Array) -> Option<Region> {
        region_of(self.ranks(), x.dtype(), x.nbytes()).filter(|_| backend() == Backend::Cuda)
    }

    /// The sum of `x` over the ranks through `region`; `checking`: the check at start's form,
    /// whose waits end after 20 s (marking [`TIMED_OUT`]) instead of stopping the process after 300.
    fn sum(&self, x: &Array, region: Region, checking: bool) -> mlx_rs::error::Result<Array> {
        let n = x.size();
        let launch = Launch {
            grid: ((region.blocks * THREADS) as i32, 1, 1),
            threads: (THREADS as i32, 1, 1),
            outputs: vec![(vec![n as i32], x.dtype()), (vec![1], Dtype::Uint32)],
            template: vec![
                ("T", TemplateArg::Type(x.dtype())),
                ("RANKS", TemplateArg::Int(self.ranks() as i32)),
                ("RANK", TemplateArg::Int(self.rank as i32)),
                ("REGION_AT", TemplateArg::Int(region.at as i32)),
                ("SLOT_BYTES", TemplateArg::Int(region.slot as i32)),
                ("CHECKING", TemplateArg::Bool(checking)),
            ],
            init: None,
        };
        // Each sum waits for the previous one (its ticket): MLX would run sums that no data
        // links side by side, in any order, and the ranks must pair theirs one by one. Inside a
        // function MLX compiles (fixed decode steps) the tickets stay within the trace; there the
        // model's sums follow one another through their data.
        thread_local! {
            static LAST: std::cell::RefCell<Option<Array>> = const { std::cell::RefCell::new(None) };
        }
        let traced = crate::engine::compiled::is_traced(x);
        let after = match LAST.with(|l| l.borrow().clone()).filter(|_| !traced) {
            Some(ticket) => ticket,
            None => crate::engine::ops::zeros(&[1], Dtype::Uint32)?,
        };
        let [y, ticket]: [Array; 2] = apply(&ALL_SUM, &[&x.reshape(&[-1])?, &self.table(), &after], launch)?
            .try_into()
            .map_err(|_| Exception::custom("sala_all_sum gives two outputs"))?;
        if !traced {
            LAST.with(|l| *l.borrow_mut() = Some(ticket));
        }
        y.reshape(x.shape())
    }
}

impl PeerSum {
    /// [`PeerSum::buffers`] as a device array (uint64 `[ranks]`), made once per thread that sums
    /// (MLX's arrays stay on the thread that made them): a new one each sum would cost the GPU
    /// a page fault where the kernel reads it.
    fn table(&self) -> Array {
        thread_local! {
            static TABLE: std::cell::RefCell<Option<(Vec<u64>, Array)>> = const { std::cell::RefCell::new(None) };
        }
        TABLE.with(|t| {
            let mut t = t.borrow_mut();
            match &*t {
                Some((buffers, table)) if *buffers == self.buffers => table.clone(),
                _ => {
                    let table = Array::from_slice(&self.buffers, &[self.ranks() as i32]);
                    *t = Some((self.buffers.clone(), table.clone()));
                    table
                }
            }
        })
    }
}

impl FastSum for PeerSum {
    fn all_sum(&self, x: &Array) -> Option<mlx_rs::error::Result<Array>> {
        self.region_for(x).map(|region| self.sum(x, region, false))
    }

    fn name(&self) -> &'static str {
        "peer memory"
    }
}

/// `tp` summing through the peers' memory where it can: an NCCL group of 2 to 8 ranks on CUDA
/// whose every rank mapped every other's buffer, and whose sums matched NCCL's on every rank.
/// Otherwise `tp` as it is, after one warning per rank that failed (naming why). Every rank of
/// the group must call it, in step: it runs collectives.
pub fn attach(tp: &TensorParallel) -> TensorParallel {
    let off = std::env::var("SALA_PEER_SUM").is_ok_and(|v| v == "off" || v == "0");
    if off || tp.is_single() || tp.size > MAX_RANKS || tp.backend() != Some(distributed::Backend::Nccl) || backend() != Backend::Cuda {
        return tp.clone();
    }
    match PeerSum::start(tp) {
        Ok(sum) => tp.with_fast_sum(Arc::new(sum)),
        Err(Failed::Here(reason)) => {
            eprintln!("warning: rank {}: tensor-parallel sums stay on NCCL ({reason}); decoding is slower than with peer memory", tp.rank);
            tp.clone()
        }
        Err(Failed::Elsewhere) => tp.clone(),
    }
}

enum Failed {
    /// This rank failed, for this reason.
    Here(String),
    /// Another rank did (it says why).
    Elsewhere,
}

/// One step of [`PeerSum::start`] on every rank: whether any failed, agreed over NCCL.
fn agree(tp: &TensorParallel, step: Result<(), String>) -> Result<(), Failed> {
    let mine = Array::from_slice(&[step.is_err() as i32], &[1]);
    let any = tp.all_max(&mine).and_then(|a| {
        a.eval()?;
        Ok(a.as_slice::<i32>()[0])
    });
    match (step, any) {
        (Err(reason), _) => Err(Failed::Here(reason)),
        (Ok(()), Ok(0)) => Ok(()),
        (Ok(()), Ok(_)) => Err(Failed::Elsewhere),
        (Ok(()), Err(e)) => Err(Failed::Here(format!("NCCL could not agree on a step: {e}"))),
    }
}

impl PeerSum {
    fn start(tp: &TensorParallel) -> Result<Self, Failed> {
        let (ranks, rank) = (tp.size, tp.rank);
        let bytes = regions(ranks).last().map_or(0, |r| region_end(*r, ranks));
        // Work on the GPU first, so that MLX's context is current on this thread (Cuda::enter).
        let warm = crate::engine::ops::zeros(&[1], Dtype::Float32).and_then(|z| z.eval()).map_err(|e| e.to_string());
        agree(tp, warm)?;
        // This rank's buffer and its handle, then every rank's handles (words of 4 bytes).
        let own = Cuda::get().and_then(|cuda| {
            let ptr = cuda.alloc_zeroed(bytes)?;
            Ok((ptr, cuda.export(ptr)?))
        });
        let handle = own.as_ref().map(|(_, h)| *h).unwrap_or([0; 64]);
        agree(tp, own.as_ref().map(|_| ()).map_err(Clone::clone))?;
        let own = own.expect("agreed that every rank has its buffer");
        let words: Vec<i32> = handle.chunks(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let all = tp
            .all_gather(&Array::from_slice(&words, &[1, words.len() as i32]))
            .and_then(|a| {
                a.eval()?;
                Ok(a.as_slice::<i32>().to_vec())
            })
            .map_err(|e| Failed::Here(format!("the buffers' handles could not be exchanged: {e}")))?;
        // Every peer's buffer mapped here.
        let mapped: Result<Vec<u64>, String> = (0..ranks)
            .map(|r| {
                if r == rank {
                    return Ok(own.0);
                }
                let mut handle = [0u8; 64];
                for (i, w) in all[r * 16..(r + 1) * 16].iter().enumerate() {
                    handle[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
                }
                Cuda::get()?.import(&handle).map_err(|e| format!("rank {r}'s buffer could not be mapped: {e}"))
            })
            .collect();
        agree(tp, mapped.as_ref().map(|_| ()).map_err(Clone::clone))?;
        let sum = PeerSum { rank, buffers: mapped.expect("agreed") };
        agree(tp, sum.check(tp))?;
        Ok(sum)
    }

    /// Sums of this rank's own random values ([`check_cases`]) through both paths, several to one
    /// graph, each within a bf16 step of NCCL's.
    fn check(&self, tp: &TensorParallel) -> Result<(), String> {
        let nccl = tp.without_fast_sum();
        let run = || -> mlx_rs::error::Result<Option<String>> {
            let mut pairs = Vec::new();
            for (i, (n, dtype)) in check_cases(self.ranks()).into_iter().enumerate() {
                let x = sample(&[n], 7000 + 31 * i as u64 + self.rank as u64, dtype)?;
                let region = self.region_for(&x).ok_or_else(|| Exception::custom("no region takes a checked sum"))?;
                let ours = self.sum(&x, region, true)?;
                let theirs = nccl.all_sum(&x).map_err(|e| Exception::custom(e.to_string()))?;
                pairs.push((n, dtype, ours, theirs));
            }
            let mut all: Vec<&Array> = Vec::new();
            for (_, _, ours, theirs) in &pairs {
                all.push(ours);
                all.push(theirs);
            }
            mlx_rs::transforms::eval(all)?;
            for (n, dtype, ours, theirs) in &pairs {
                let (ours, theirs) = (ours.as_dtype(Dtype::Float32)?, theirs.as_dtype(Dtype::Float32)?);
                let largest = |a: Array| -> mlx_rs::error::Result<f32> {
                    let a = a.abs()?.max(None)?;
                    a.eval()?;
                    Ok(a.as_slice::<f32>()[0])
                };
                let (off, scale) = (largest(ours.subtract(&theirs)?)?, largest(theirs)?);
                if off.is_nan() || off > scale / 64.0 {
                    return Ok(Some(format!("its sum of {n} {dtype:?} values is {off} off NCCL's (largest {scale})")));
                }
            }
            Ok(None)
        };
        let outcome = run();
        let waited_out = Cuda::get().and_then(|cuda| cuda.read_word(self.buffers[self.rank] + 4 * TIMED_OUT as u64));
        match waited_out {
            Ok(0) => {}
            Ok(_) => return Err("the other ranks' flags did not arrive within 20 s (no path between the GPUs?)".into()),
            Err(e) => return Err(format!("its buffer could not be read back: {e}")),
        }
        match outcome {
            Ok(None) => Ok(()),
            Ok(Some(wrong)) => Err(wrong),
            Err(e) => Err(format!("its check failed: {e}")),
        }
    }
}

/// The sums the check at start compares with NCCL's, (values, type), every region's slots in
/// turn: bf16 as a decoding token, one float32 value (a lightning norm's squares), f16 over a few
/// blocks with values past the last whole piece, float32 filling most of the small slot; on two
/// ranks also a prompt chunk's 16 MiB of bf16 and three float32 values short of 16 MiB.
fn check_cases(ranks: usize) -> Vec<(i32, Dtype)> {
    let mut cases = vec![(4096, Dtype::Bfloat16), (1, Dtype::Float32), (4096, Dtype::Bfloat16), (12_301, Dtype::Float16), (200_003, Dtype::Float32)];
    if regions(ranks).iter().any(|r| r.slot >= 16 << 20) {
        cases.extend([(2048 * 4096, Dtype::Bfloat16), (1024 * 4096 - 3, Dtype::Float32)]);
    }
    cases.push((4096, Dtype::Bfloat16));
    cases
}

/// The CUDA driver calls the exchange needs, from the driver library beside every NVIDIA driver
/// (MLX has loaded it), in MLX's context ([`Cuda::enter`]).
struct Cuda {
    lib: &'static libloading::Library,
}

type CuResult = i32;

/// CUipcMemHandle.
#[repr(C)]
#[derive(Clone, Copy)]
struct IpcHandle {
    reserved: [u8; 64],
}

impl Cuda {
    fn get() -> Result<&'static Cuda, String> {
        static CUDA: OnceLock<Result<Cuda, String>> = OnceLock::new();
        CUDA.get_or_init(|| {
            let lib = crate::engine::device::cuda_driver().ok_or("the CUDA driver library (libcuda.so.1) could not be loaded")?;
            let cuda = Cuda { lib };
            cuda.enter()?;
            Ok(cuda)
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    fn symbol<F: Copy>(&self, name: &str) -> Result<F, String> {
        let c = format!("{name}\0");
        // SAFETY: F is the C signature of `name` in the CUDA driver API (each call site says which).
        unsafe { self.lib.get::<F>(c.as_bytes()).map(|s| *s).map_err(|e| format!("{name}: {e}")) }
    }

    fn check(&self, name: &str, code: CuResult) -> Result<(), String> {
        if code == 0 {
            return Ok(());
        }
        let mut text: *const std::ffi::c_char = std::ptr::null();
        let described = self
            .symbol::<unsafe extern "C" fn(CuResult, *mut *const std::ffi::c_char) -> CuResult>("cuGetErrorName")
            // SAFETY: cuGetErrorName writes a pointer to a static string.
            .is_ok_and(|f| unsafe { f(code, &mut text) } == 0 && !text.is_null());
        // SAFETY: a NUL-terminated static string from the driver.
        let name_of = if described { unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy().into_owned() } else { format!("error {code}") };
        Err(format!("{name}: {name_of}"))
    }

    /// Makes MLX's context current on this thread (every later call is from it): the one MLX's
    /// runtime calls made current here (NCCL's start selected MLX's device), else device 0's
    /// primary context, which is MLX's where a rank sees one GPU (as our launcher starts them).
    fn enter(&self) -> Result<(), String> {
        let init = self.symbol::<unsafe extern "C" fn(u32) -> CuResult>("cuInit")?;
        let current = self.symbol::<unsafe extern "C" fn(*mut *mut std::ffi::c_void) -> CuResult>("cuCtxGetCurrent")?;
        let device_get = self.symbol::<unsafe extern "C" fn(*mut i32, i32) -> CuResult>("cuDeviceGet")?;
        let retain = self.symbol::<unsafe extern "C" fn(*mut *mut std::ffi::c_void, i32) -> CuResult>("cuDevicePrimaryCtxRetain")?;
        let set = self.symbol::<unsafe extern "C" fn(*mut std::ffi::c_void) -> CuResult>("cuCtxSetCurrent")?;
        let (mut device, mut context) = (0, std::ptr::null_mut());
        // SAFETY: the driver API's documented signatures; outputs written on success.
        unsafe {
            self.check("cuInit", init(0))?;
            self.check("cuCtxGetCurrent", current(&mut context))?;
            if !context.is_null() {
                return Ok(());
            }
            self.check("cuDeviceGet", device_get(&mut device, 0))?;
            self.check("cuDevicePrimaryCtxRetain", retain(&mut context, device))?;
            self.check("cuCtxSetCurrent", set(context))
        }
    }

    /// `bytes` of device memory, zeroed before this returns (peers write flags into it as soon
    /// as they have its handle).
    fn alloc_zeroed(&self, bytes: usize) -> Result<u64, String> {
        let alloc = self.symbol::<unsafe extern "C" fn(*mut u64, usize) -> CuResult>("cuMemAlloc_v2")?;
        let memset = self.symbol::<unsafe extern "C" fn(u64, u8, usize) -> CuResult>("cuMemsetD8_v2")?;
        let sync = self.symbol::<unsafe extern "C" fn() -> CuResult>("cuCtxSynchronize")?;
        let mut ptr = 0u64;
        // SAFETY: the driver API's documented signatures; the memory is this process's until exit
        // (peers map it for as long as the group lives).
        unsafe {
            self.check("cuMemAlloc", alloc(&mut ptr, bytes))?;
            self.check("cuMemsetD8", memset(ptr, 0, bytes))?;
            self.check("cuCtxSynchronize", sync())?;
        }
        Ok(ptr)
    }

    /// The 32-bit word at `ptr` in device memory (after the work queued before it).
    fn read_word(&self, ptr: u64) -> Result<u32, String> {
        let copy = self.symbol::<unsafe extern "C" fn(*mut u32, u64, usize) -> CuResult>("cuMemcpyDtoH_v2")?;
        let sync = self.symbol::<unsafe extern "C" fn() -> CuResult>("cuCtxSynchronize")?;
        let mut word = 0u32;
        // SAFETY: four bytes into a u32 this function owns.
        unsafe {
            self.check("cuCtxSynchronize", sync())?;
            self.check("cuMemcpyDtoH", copy(&mut word, ptr, 4))?;
        }
        Ok(word)
    }

    /// The IPC handle of an allocation of [`Cuda::alloc_zeroed`].
    fn export(&self, ptr: u64) -> Result<[u8; 64], String> {
        let get = self.symbol::<unsafe extern "C" fn(*mut IpcHandle, u64) -> CuResult>("cuIpcGetMemHandle")?;
        let mut handle = IpcHandle { reserved: [0; 64] };
        // SAFETY: the driver writes the 64-byte handle.
        unsafe { self.check("cuIpcGetMemHandle", get(&mut handle, ptr))? };
        Ok(handle.reserved)
    }

    /// Another process's allocation mapped here, with peer access to its GPU enabled.
    fn import(&self, handle: &[u8; 64]) -> Result<u64, String> {
        const LAZY_ENABLE_PEER_ACCESS: u32 = 1;
        type Open = unsafe extern "C" fn(*mut u64, IpcHandle, u32) -> CuResult;
        let open = self.symbol::<Open>("cuIpcOpenMemHandle_v2").or_else(|_| self.symbol::<Open>("cuIpcOpenMemHandle"))?;
        let mut ptr = 0u64;
        // SAFETY: the handle goes by value, as the C struct does.
        unsafe { self.check("cuIpcOpenMemHandle", open(&mut ptr, IpcHandle { reserved: *handle }, LAZY_ENABLE_PEER_ACCESS))? };
        Ok(ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: i32, dtype: Dtype) -> usize {
        n as usize * if dtype == Dtype::Float32 { 4 } else { 2 }
    }

    #[test]
    fn regions_lie_apart_inside_what_the_kernel_addresses() {
        for ranks in 2..=MAX_RANKS {
            let all = regions(ranks);
            let mut end = 0;
            for r in &all {
                assert!(r.at >= end, "{ranks} ranks: regions overlap");
                assert!(r.blocks >= 1 && r.blocks <= MAX_BLOCKS && r.slot.is_multiple_of(16));
                end = region_end(*r, ranks);
                assert!(end <= i32::MAX as usize, "REGION_AT and SLOT_BYTES are 32-bit template arguments");
            }
            assert_eq!(all.len(), if ranks == 2 { 2 } else { 1 }, "{ranks} ranks");
        }
    }

    #[test]
    fn a_sum_goes_to_the_smallest_region_that_holds_it() {
        let small = |ranks, dtype, b| region_of(ranks, dtype, b).map(|r| r.slot);
        assert_eq!(small(2, Dtype::Bfloat16, 8192), Some(1 << 20));
        assert_eq!(small(2, Dtype::Float32, 4), Some(1 << 20));
        assert_eq!(small(2, Dtype::Bfloat16, (1 << 20) + 2), Some(16 << 20));
        assert_eq!(small(2, Dtype::Bfloat16, 16 << 20), Some(16 << 20));
        assert_eq!(small(2, Dtype::Bfloat16, (16 << 20) + 2), None);
        assert_eq!(small(4, Dtype::Bfloat16, 16 << 20), None, "one-shot on four ranks keeps to decoding sums");
        assert_eq!(small(4, Dtype::Float16, 1 << 20), Some(1 << 20));
        assert_eq!(small(2, Dtype::Int32, 64), None);
        assert_eq!(small(2, Dtype::Bfloat16, 0), None);
    }

    #[test]
    fn the_check_at_start_fits_and_fills_every_region_twice() {
        for ranks in 2..=MAX_RANKS {
            let cases = check_cases(ranks);
            let mut used = vec![0; regions(ranks).len()];
            for &(n, dtype) in &cases {
                let region = region_of(ranks, dtype, bytes(n, dtype)).unwrap_or_else(|| panic!("{ranks} ranks: no region takes {n} {dtype:?}"));
                used[regions(ranks).iter().position(|r| r.at == region.at).unwrap()] += 1;
            }
            assert!(used.iter().all(|&u| u >= 2), "{ranks} ranks: sums a region: {used:?}");
            // Past the last whole piece, and over more than one block of the small region.
            assert!(cases.iter().any(|&(n, dtype)| !bytes(n, dtype).is_multiple_of(16)));
            assert!(cases.iter().any(|&(n, dtype)| bytes(n, dtype) > 16 * THREADS * 8));
        }
    }
}
