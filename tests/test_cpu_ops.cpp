// placeholder until the real file is written (overwrite freely)
