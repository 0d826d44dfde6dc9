// Stand-in for Apple's <Metal/Metal.h> (see Foundation/Foundation.h here).
// __MAC_OS_X_VERSION_MAX_ALLOWED says which SDK it plays: macOS 15 added
// MTLCompileOptions.mathMode and deprecated fastMathEnabled.
#pragma once

#import <Foundation/Foundation.h>
#include <dispatch/dispatch.h>

typedef struct {
  NSUInteger width, height, depth;
} MTLSize;

static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
  MTLSize size = {width, height, depth};
  return size;
}

enum MTLLanguageVersion : NSUInteger { MTLLanguageVersion3_1 = (3 << 16) + 1 };

#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
enum MTLMathMode : NSInteger { MTLMathModeSafe = 0, MTLMathModeRelaxed = 1, MTLMathModeFast = 2 };
enum MTLMathFloatingPointFunctions : NSInteger {
  MTLMathFloatingPointFunctionsFast = 0,
  MTLMathFloatingPointFunctionsPrecise = 1,
};
#endif

@interface MTLCompileOptions : NSObject
@property(readwrite, nonatomic) MTLLanguageVersion languageVersion;
@property(readwrite, nonatomic) BOOL fastMathEnabled;
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
@property(readwrite, nonatomic) MTLMathMode mathMode;
@property(readwrite, nonatomic) MTLMathFloatingPointFunctions mathFloatingPointFunctions;
#endif
@end

@protocol MTLFunction <NSObject>
@end

@protocol MTLLibrary <NSObject>
- (nullable id<MTLFunction>)newFunctionWithName:(nonnull NSString*)functionName;
@end

@protocol MTLComputePipelineState <NSObject>
@property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property(readonly) NSUInteger threadExecutionWidth;
@end

@protocol MTLBuffer <NSObject>
- (nonnull void*)contents __attribute__((objc_returns_inner_pointer));
@property(readonly) NSUInteger length;
@end

@protocol MTLComputeCommandEncoder <NSObject>
- (void)setComputePipelineState:(nonnull id<MTLComputePipelineState>)state;
- (void)setBuffer:(nullable id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setBytes:(nonnull const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid
       threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
@end

@protocol MTLCommandBuffer <NSObject>
@end

@protocol MTLCommandQueue <NSObject>
@end

@protocol MTLDevice <NSObject>
- (nullable id<MTLLibrary>)newLibraryWithSource:(nonnull NSString*)source
                                        options:(nullable MTLCompileOptions*)options
                                          error:(__autoreleasing NSError* _Nullable* _Nullable)error;
- (nullable id<MTLComputePipelineState>)
    newComputePipelineStateWithFunction:(nonnull id<MTLFunction>)computeFunction
                                  error:(__autoreleasing NSError* _Nullable* _Nullable)error;
@end
