"""Many-replica numerics: identical replicas trained as one batched call (`batched`), their
parameters and optimizer state as rows of one tensor (`bank`), and their convolutions as one
matrix product (`conv`)."""
