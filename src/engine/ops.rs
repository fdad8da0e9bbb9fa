//! Small MLX helpers shared by models and kernels.

use mlx_rs::{error::Result, Array, Dtype};
use std::cell::RefCell;
use std::collections::HashMap;

/// A 0-d array of `value` in `dtype` (so arithmetic keeps the other operand's dtype), made once
/// per thread and reused: on CUDA, MLX keeps arrays in managed memory, and the GPU takes a page
/// fault on every array the host has just written (eval/results/kernel-notes.md).
pub fn scalar(value: f32, dtype: Dtype) -> Result<Array> {
    made_once(&[], value, dtype, || Array::from_f32(value).as_dtype(dtype))
}

/// Zeros of `shape` in `dtype`, made once per thread and shape and reused (as [`scalar`]).
pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
    made_once(shape, 0.0, dtype, || mlx_rs::ops::zeros_dtype(shape, dtype))
}

/// The constant array of `shape` filled with `value` in `dtype`, evaluated once per thread by
/// `make` and kept.
fn made_once(shape: &[i32], value: f32, dtype: Dtype, make: impl FnOnce() -> Result<Array>) -> Result<Array> {
    /// Shape, value bits, dtype.
    type Key = (Vec<i32>, u32, u32);
    thread_local! {
        static MADE: RefCell<HashMap<Key, Array>> = RefCell::new(HashMap::new());
    }
    MADE.with(|made| {
        let mut made = made.borrow_mut();
        let key = (shape.to_vec(), value.to_bits(), dtype as u32);
        if let Some(a) = made.get(&key) {
            return Ok(a.clone());
        }
        if made.len() >= 1024 {
            made.clear(); // Callers use a handful of constants and shapes; never grow without bound.
        }
        // Made and evaluated on this thread's own stream even while a decode step is being
        // built for the evaluator thread (engine::encoder).
        let a = super::encoder::own_stream(|| -> Result<Array> {
            let a = make()?;
            a.eval()?;
            Ok(a)
        })?;
        made.insert(key, a.clone());
        Ok(a)
    })
}

/// Elementwise `a ^ b` of integer arrays (in mlx-c, not wrapped by mlx-rs).
pub fn bitwise_xor(a: &Array, b: &Array) -> Result<Array> {
    integer_op(mlx_sys::mlx_bitwise_xor, "bitwise_xor", a, b)
}

/// Elementwise `a & b` of integer arrays (in mlx-c, not wrapped by mlx-rs).
pub fn bitwise_and(a: &Array, b: &Array) -> Result<Array> {
    integer_op(mlx_sys::mlx_bitwise_and, "bitwise_and", a, b)
}

/// Elementwise `a >> b` of integer arrays (in mlx-c, not wrapped by mlx-rs).
pub fn right_shift(a: &Array, b: &Array) -> Result<Array> {
    integer_op(mlx_sys::mlx_right_shift, "right_shift", a, b)
}

/// Each value as float8 e4m3, its bits in a uint8 array (MLX's `to_fp8`: to nearest, e4m3's
/// largest finite value 448; in mlx-c, not wrapped by mlx-rs).
pub fn to_fp8(x: &Array) -> Result<Array> {
    // SAFETY: `x` and the stream outlive the call.
    mlx_op("to_fp8", |res, stream| unsafe { mlx_sys::mlx_to_fp8(res, x.as_ptr(), stream) })
}

/// float8 e4m3 bits (uint8) as values of `dtype` (MLX's `from_fp8`; exact in every float dtype).
pub fn from_fp8(bits: &Array, dtype: Dtype) -> Result<Array> {
    let dtype = dtype as mlx_sys::mlx_dtype;
    // SAFETY: `bits` and the stream outlive the call.
    mlx_op("from_fp8", |res, stream| unsafe { mlx_sys::mlx_from_fp8(res, bits.as_ptr(), dtype, stream) })
}

type BinaryOp = unsafe extern "C" fn(*mut mlx_sys::mlx_array, mlx_sys::mlx_array, mlx_sys::mlx_array, mlx_sys::mlx_stream) -> std::os::raw::c_int;

fn integer_op(op: BinaryOp, name: &str, a: &Array, b: &Array) -> Result<Array> {
    // SAFETY: `a`, `b` and the stream outlive the call.
    mlx_op(name, |res, stream| unsafe { op(res, a.as_ptr(), b.as_ptr(), stream) })
}

/// The array an mlx-c operation writes into a fresh handle (`call` gets it and the thread's
/// stream, and returns mlx-c's status); freed here if the operation fails.
fn mlx_op(name: &str, call: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> std::os::raw::c_int) -> Result<Array> {
    let stream = mlx_rs::Stream::thread_local_or_default();
    // SAFETY: `res` is a fresh handle that the `Array` owns on success and that is freed on failure.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        if call(&mut res, stream.as_ptr()) != 0 {
            mlx_sys::mlx_array_free(res);
            return Err(mlx_rs::error::Exception::custom(format!("MLX {name} failed")));
        }
        Ok(Array::from_ptr(res))
    }
}

/// `[0, 1, ..., n-1]` as float32.
pub fn arange_f32(n: usize) -> Result<Array> {
    Array::arange::<f32, f32>(None, n as f32, None)
}

/// `[start, ..., start+n-1]` as int32.
pub fn arange_i32(start: usize, n: usize) -> Result<Array> {
    Array::arange::<i32, i32>(start as i32, (start + n) as i32, None)
}

/// Host copy of a float array (any float dtype), contiguous and in f32.
pub fn to_vec_f32(a: &Array) -> Result<Vec<f32>> {
    let a = a.as_dtype(Dtype::Float32)?;
    // A reshape to 1-D forces a contiguous copy when `a` is a strided view.
    let flat = a.reshape(&[-1])?;
    flat.eval()?;
    Ok(flat.as_slice::<f32>().to_vec())
}

/// Host copy of an integer array as i32.
pub fn to_vec_i32(a: &Array) -> Result<Vec<i32>> {
    let flat = a.as_dtype(Dtype::Int32)?.reshape(&[-1])?;
    flat.eval()?;
    Ok(flat.as_slice::<i32>().to_vec())
}

/// The raw little-endian bytes of any array, in row-major order.
pub fn to_bytes(a: &Array) -> Result<Vec<u8>> {
    let flat = a.reshape(&[-1])?.view::<u8>()?;
    flat.eval()?;
    Ok(flat.as_slice::<u8>().to_vec())
}

/// `input`, computed only after `on` (MLX's `depends`): for ordering work whose result does not
/// feed into it, such as a mark on the device's timeline.
pub fn depends(input: &Array, on: &Array) -> Result<Array> {
    let (inputs, on) = (ArrayList::of(&[input]), ArrayList::of(&[on]));
    let mut result = ArrayList::empty();
    // SAFETY: three live vectors; `result` is filled by the call.
    let status = unsafe { mlx_sys::mlx_depends(result.as_mut_ptr(), inputs.as_ptr(), on.as_ptr()) };
    match (status, result.into_arrays().pop()) {
        (0, Some(out)) => Ok(out),
        _ => Err(mlx_rs::error::Exception::custom("MLX refused `depends`")),
    }
}

/// MLX's C vector of arrays (`mlx_vector_array`), freed on drop: how mlx-c takes and gives
/// several arrays at once.
pub struct ArrayList(mlx_sys::mlx_vector_array);

impl ArrayList {
    pub fn empty() -> Self {
        // SAFETY: a fresh, empty vector this value owns.
        Self(unsafe { mlx_sys::mlx_vector_array_new() })
    }

    /// A vector holding (new references to) `arrays`.
    pub fn of(arrays: &[&Array]) -> Self {
        let list = Self::empty();
        for a in arrays {
            // SAFETY: `list` and `a` are live; the vector takes its own reference.
            unsafe { mlx_sys::mlx_vector_array_append_value(list.0, a.as_ptr()) };
        }
        list
    }

    pub fn as_ptr(&self) -> mlx_sys::mlx_vector_array {
        self.0
    }

    /// For an mlx-c call that fills the vector in place (its output arguments).
    pub fn as_mut_ptr(&mut self) -> *mut mlx_sys::mlx_vector_array {
        &mut self.0
    }

    pub fn len(&self) -> usize {
        // SAFETY: a live vector.
        unsafe { mlx_sys::mlx_vector_array_size(self.0) }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The arrays, as new references (the vector is freed).
    pub fn into_arrays(self) -> Vec<Array> {
        // SAFETY: a live vector this value owns.
        unsafe { arrays_of(self.0) }
    }
}

/// New references to the arrays of an mlx-c vector that someone else owns (one MLX hands a
/// callback, say).
///
/// # Safety
/// `vector` must be a live `mlx_vector_array`.
pub unsafe fn arrays_of(vector: mlx_sys::mlx_vector_array) -> Vec<Array> {
    (0..unsafe { mlx_sys::mlx_vector_array_size(vector) })
        .map(|i| {
            // SAFETY: `i` is in range; `get` fills a fresh handle that the `Array` then owns.
            unsafe {
                let mut out = mlx_sys::mlx_array_new();
                mlx_sys::mlx_vector_array_get(&mut out, vector, i);
                Array::from_ptr(out)
            }
        })
        .collect()
}

impl Drop for ArrayList {
    fn drop(&mut self) {
        // SAFETY: the vector is owned by this value and freed once.
        unsafe { mlx_sys::mlx_vector_array_free(self.0) };
    }
}

/// `a[start : start + size]` along `axes`, with `start` an int32 array (one entry per axis)
/// that the device reads: the slice's place can change from call to call without changing the
/// graph (MLX's `slice_dynamic`; mlx-rs does not wrap it).
pub fn slice_dynamic(a: &Array, start: &Array, axes: &[i32], size: &[i32]) -> Result<Array> {
    mlx_op("slice_dynamic", |res, stream| {
        // SAFETY: the arrays and slices outlive the call.
        unsafe { mlx_sys::mlx_slice_dynamic(res, a.as_ptr(), start.as_ptr(), axes.as_ptr(), axes.len(), size.as_ptr(), size.len(), stream) }
    })
}

/// `a` with `update` written at `start` along `axes` (`start` an int32 array, one entry per
/// axis, read by the device; see [`slice_dynamic`]).
pub fn slice_update_dynamic(a: &Array, update: &Array, start: &Array, axes: &[i32]) -> Result<Array> {
    mlx_op("slice_update_dynamic", |res, stream| {
        // SAFETY: the arrays and `axes` outlive the call.
        unsafe { mlx_sys::mlx_slice_update_dynamic(res, a.as_ptr(), update.as_ptr(), start.as_ptr(), axes.as_ptr(), axes.len(), stream) }
    })
}

/// Keeps a long multi-token forward call (a prefill chunk) at most two residual branches (a
/// mixer or an MLP) ahead of the device. MLX allocates each operation's output when the host
/// encodes it and frees it when the device has run it, and the host encodes a whole chunk long
/// before the device finishes; so without a wait every layer's temporaries — a prefill chunk's
/// dequantized weights above all — were alive at once. Pacing per branch keeps the least alive,
/// for little prefill speed (eval/results/kernel-notes.md).
///
/// A forward call built for the evaluator thread (a decode step with prompt chunks riding it,
/// engine::encoder) is paced through it: each branch is queued there, and the builder waits for
/// the device to finish the branch before, read back as one value.
pub struct Pacer {
    queued: Vec<Array>,
    on: bool,
    /// Pacing through the evaluator: a value of the last branch queued, not read yet.
    behind: Option<Array>,
}

impl Pacer {
    /// Rows (batch × tokens) of a forward call from which it is paced: fewer rows make little
    /// working memory, and a decode step must not wait for the one before it.
    pub const FROM_ROWS: usize = 256;

    pub fn new(rows: usize) -> Self {
        Self { queued: Vec::new(), on: rows >= Self::FROM_ROWS, behind: None }
    }

    /// Queues the arrays `outputs` lists (a branch's output and its layer's cache) for the device
    /// and waits for the previous step's. Listed only when pacing: a decode step would pay for
    /// the copies of every handle twice a layer.
    pub fn step(&mut self, outputs: impl FnOnce() -> Vec<Array>) -> Result<()> {
        if !self.on {
            return Ok(());
        }
        let arrays = outputs();
        super::device::await_kernel_compiles();
        if super::encoder::building_for_evaluator() {
            use mlx_rs::ops::indexing::TryIndexOp;
            let encoder = super::encoder::Encoder::for_this_thread();
            let mark = arrays[0].reshape(&[-1])?.try_index(0..1)?.as_dtype(Dtype::Int32)?;
            encoder.queue(arrays)?;
            if let Some(before) = self.behind.replace(mark) {
                encoder.read_i32(&before)?;
            }
            return Ok(());
        }
        mlx_rs::transforms::async_eval(&arrays)?;
        mlx_rs::transforms::eval(&self.queued)?;
        self.queued = arrays;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_gives_the_input_computed_after_what_it_waits_for() {
        let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
        let waited = x.multiply(&x).unwrap();
        let y = depends(&x.add(&x).unwrap(), &waited).unwrap();
        mlx_rs::transforms::eval([&y]).unwrap();
        assert_eq!(y.as_slice::<f32>(), &[2.0, 4.0, 6.0]);
        // `waited` was computed on the way.
        let mut available = false;
        unsafe { mlx_sys::_mlx_array_is_available(&mut available, waited.as_ptr()) };
        assert!(available);
    }

    #[test]
    fn dynamic_slices_read_and_write_where_the_device_array_says() {
        let a = Array::from_slice(&(0..12).map(|i| i as f32).collect::<Vec<_>>(), &[3, 4]);
        let start = Array::from_slice(&[2i32], &[1]);
        let column = slice_dynamic(&a, &start, &[1], &[3, 1]).unwrap();
        assert_eq!(to_vec_f32(&column).unwrap(), vec![2.0, 6.0, 10.0]);
        let written = slice_update_dynamic(&a, &Array::from_slice(&[-1.0f32; 3], &[3, 1]), &Array::from_slice(&[1i32], &[1]), &[1]).unwrap();
        let mut want: Vec<f32> = (0..12).map(|i| i as f32).collect();
        for row in 0..3 {
            want[row * 4 + 1] = -1.0;
        }
        assert_eq!(to_vec_f32(&written).unwrap(), want);
        // The source is unchanged: a write makes a new array.
        assert_eq!(to_vec_f32(&a).unwrap()[1], 1.0);
    }

    #[test]
    fn array_lists_hand_back_what_they_were_given() {
        let (a, b) = (Array::from_slice(&[1i32, 2], &[2]), Array::from_slice(&[3.5f32], &[1]));
        let list = ArrayList::of(&[&a, &b]);
        assert_eq!(list.len(), 2);
        let back = list.into_arrays();
        assert_eq!(to_vec_i32(&back[0]).unwrap(), vec![1, 2]);
        assert_eq!(to_vec_f32(&back[1]).unwrap(), vec![3.5]);
    }
}
