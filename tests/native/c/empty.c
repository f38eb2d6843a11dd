/* a driver library that defines none of the functions gpupool hooks */
int gpupool_empty_driver(void) { return 0; }
