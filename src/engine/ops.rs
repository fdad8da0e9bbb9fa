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

type BinaryOp = unsafe extern "C" fn(*mut mlx_sys::mlx_array, mlx_sys::mlx_array, mlx_sys::mlx_array, mlx_sys::mlx_stream) -> std::os::raw::c_int;

fn integer_op(op: BinaryOp, name: &str, a: &Array, b: &Array) -> Result<Array> {
    let stream = mlx_rs::Stream::thread_local_or_default();
    // SAFETY: `res` is a fresh array handle the op fills (freed here if it fails); `a`, `b` and
    // the stream outlive the call.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        if op(&mut res, a.as_ptr(), b.as_ptr(), stream.as_ptr()) != 0 {
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
    unsafe {
        let (inputs, on_vector) = (mlx_sys::mlx_vector_array_new(), mlx_sys::mlx_vector_array_new());
        mlx_sys::mlx_vector_array_append_value(inputs, input.as_ptr());
        mlx_sys::mlx_vector_array_append_value(on_vector, on.as_ptr());
        let mut result = mlx_sys::mlx_vector_array_new();
        let status = mlx_sys::mlx_depends(&mut result, inputs, on_vector);
        let mut out = None;
        if status == 0 && mlx_sys::mlx_vector_array_size(result) == 1 {
            let mut array = mlx_sys::mlx_array_new();
            mlx_sys::mlx_vector_array_get(&mut array, result, 0);
            out = Some(Array::from_ptr(array));
        }
        mlx_sys::mlx_vector_array_free(inputs);
        mlx_sys::mlx_vector_array_free(on_vector);
        mlx_sys::mlx_vector_array_free(result);
        out.ok_or_else(|| mlx_rs::error::Exception::custom("MLX refused `depends`"))
    }
}

/// Keeps a long multi-token forward call (a prefill chunk) at most two residual branches (a
/// mixer or an MLP) ahead of the device. MLX allocates each operation's output when the host
/// encodes it and frees it when the device has run it, and the host encodes a whole chunk long
/// before the device finishes; so without a wait every layer's temporaries — a prefill chunk's
/// dequantized weights above all — were alive at once. Pacing per branch keeps the least alive,
/// for little prefill speed (eval/results/kernel-notes.md).
pub struct Pacer {
    queued: Vec<Array>,
    on: bool,
}

impl Pacer {
    /// Rows (batch × tokens) of a forward call from which it is paced: fewer rows make little
    /// working memory, and a decode step must not wait for the one before it.
    pub const FROM_ROWS: usize = 256;

    pub fn new(rows: usize) -> Self {
        Self { queued: Vec::new(), on: rows >= Self::FROM_ROWS }
    }

    /// Queues the arrays `outputs` lists (a branch's output and its layer's cache) for the device
    /// and waits for the previous step's. Listed only when pacing: a decode step would pay for
    /// the copies of every handle twice a layer.
    pub fn step(&mut self, outputs: impl FnOnce() -> Vec<Array>) -> Result<()> {
        if self.on {
            let arrays = outputs();
            mlx_rs::transforms::async_eval(&arrays)?;
            mlx_rs::transforms::eval(&self.queued)?;
            self.queued = arrays;
        }
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
}
