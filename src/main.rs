use mlx_rs::{ops, Array};
fn main() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    let b = ops::matmul(&a, &a).unwrap();
    println!("{:?}", b);
    let h = a.as_dtype(mlx_rs::Dtype::Bfloat16).unwrap();
    println!("{:?}", h.as_slice::<half::bf16>());
    let r = mlx_rs::random::normal::<f32>(&[3], None, None, None).unwrap();
    println!("{:?}", r);
}
